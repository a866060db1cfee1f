"""``tracekit record`` of real programs that allocate through RMM (issue 42, item 3), on a GPU.

Marked ``gpu``; also skipped where RMM cannot be imported (its wheels are carried to the device
machine: ``scripts/gpu_rmm_device.sh``). Each program keeps its own witness beside the recording:
RMM's ``StatisticsResourceAdaptor``, set by the program over its resource, counts every allocation
and its bytes; the trace must hold the same allocations, and the model of RMM's pool must fail at
the event where the real pool failed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Op, Source, Trace, read_trace
from tracekit.trace.live import live_bytes, paired_frees

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20


def _reason() -> str | None:
    try:
        import rmm  # noqa: F401
    except Exception as e:
        return f"RMM is not importable ({type(e).__name__}: {e})"
    if sys.version_info < (3, 12):
        return "record --rmm needs Python 3.12+"
    return None


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(_reason() is not None, reason=str(_reason()))]

# the programs, as committed beside their traces (traces/rmm-record: what TRACEKIT_GPU_KEEP keeps)
PROGRAMS = ROOT / "traces" / "rmm-record"
CUPY_PROGRAM = (PROGRAMS / "cupy-pool.app.py").read_text()  # maximum_pool_size 512 MiB


def requested_live(trace: Trace) -> np.ndarray:
    """Requested bytes live after every row (a free takes back its malloc's request)."""
    ev = trace.events
    return live_bytes(ev.size, ev.op == Op.MALLOC, paired_frees(ev.op, trace.mate), trace.mate)


def _keep(tmp: Path, name: str) -> None:
    """With TRACEKIT_GPU_KEEP set, the test's trace and witness are copied there (fixtures, study)."""
    keep = os.environ.get("TRACEKIT_GPU_KEEP")
    if keep:
        dest = Path(keep) / name
        dest.mkdir(parents=True, exist_ok=True)
        for f in ("t.parquet", "witness.json", "app.py"):
            if (tmp / f).exists():
                shutil.copy(tmp / f, dest / f)


def _record(tmp: Path, program: str, *opts: str) -> subprocess.CompletedProcess[str]:
    (tmp / "app.py").write_text(textwrap.dedent(program))
    return subprocess.run([sys.executable, "-m", "tracekit", "record", *opts, "app.py", "witness.json"],
                          capture_output=True, text=True, cwd=tmp, timeout=300,
                          env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"})


def test_record_rmm_holds_every_allocation_rmms_statistics_count(tmp_path: Path) -> None:
    maximum = 512 * MiB
    done = _record(tmp_path, CUPY_PROGRAM, "--rmm", "-o", "t.parquet")
    _keep(tmp_path, "cupy-pool")
    assert done.returncode == 0, done.stderr
    witness = json.loads((tmp_path / "witness.json").read_text())
    trace = read_trace(tmp_path / "t.parquet")
    ev = trace.events
    assert trace.meta.source == Source.RMM
    mallocs = ev.op == Op.MALLOC
    nulls = trace.meta.extra["rmm_record"]["null_allocations"]  # 0-byte requests: RMM gives nullptr
    assert int(mallocs.sum()) + nulls == witness["total_count"]
    assert int(ev.size[mallocs].sum()) == witness["total_bytes"]
    assert int(requested_live(trace).max()) == witness["peak_bytes"]
    assert witness["failed"] and int((ev.op == Op.OOM).sum()) >= 1
    assert trace.meta.extra["rmm_record"]["logging"] == "record --rmm"
    # the program's pool as it set it up: measured initial size 0, its maximum the trace's pool limit
    assert trace.meta.recorded.rmm_pool.initial_bytes == 0 and trace.meta.pool_limit_bytes == maximum
    assert not list(tmp_path.glob("*.rmm.*.csv")), "the recorder's own RMM logs are left behind"
    # the model of RMM's pool fails where the real pool failed (the first allocate failure)
    first_oom = int(ev.seq[np.flatnonzero(ev.op == Op.OOM)[0]])
    r = subprocess.run([sys.executable, "-m", "tracekit", "replay", str(tmp_path / "t.parquet"),
                        "--sim", "rmm-pool", "--capacity", str(maximum), "--stop-at-first-oom", "--json"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["oom"] is not None and got["oom"]["seq"] == first_oom, (got["oom"], first_oom)


def test_the_programs_own_rmm_logging_is_the_trace(tmp_path: Path) -> None:
    program = """
        import sys, json
        import cupy as cp
        import rmm, rmm.mr
        from rmm.allocators.cupy import rmm_cupy_allocator
        rmm.reinitialize(pool_allocator=True, initial_pool_size=0, logging=True, log_file_name="own.csv")
        cp.cuda.set_allocator(rmm_cupy_allocator)
        xs = [cp.arange(1000 * (i + 1)) for i in range(20)]
        del xs[::2]
        json.dump({"logs": rmm.mr.get_log_filenames()}, open(sys.argv[1], "w"))
    """
    done = _record(tmp_path, program, "-o", "t.parquet")  # no --rmm: the program logs itself
    _keep(tmp_path, "own-logging")
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    own = tmp_path / "own.dev0.csv"
    assert own.exists()  # the program's file stays
    lines = [x.split(",") for x in own.read_text().splitlines()[1:]]
    assert trace.meta.source == Source.RMM and trace.meta.extra["rmm_record"]["logging"] == "program"
    ev = trace.events
    # the program's 20 arrays and the 10 it deleted; the frees at the interpreter's exit come after the
    # recording ended (in the file, not the trace)
    assert int((ev.op == Op.MALLOC).sum()) == 20 and int((ev.op == Op.FREE).sum()) == 10
    assert [int(x[3], 16) for x in lines[: len(ev)]] == ev.addr.tolist()


def test_record_rmm_of_a_pytorch_program_on_rmms_allocator(tmp_path: Path) -> None:
    pytest.importorskip("torchvision", reason="torchvision is not installed")
    program = (PROGRAMS / "torch.app.py").read_text()
    done = _record(tmp_path, program, "--rmm", "-o", "t.parquet")
    _keep(tmp_path, "torch")
    assert done.returncode == 0, done.stderr
    witness = json.loads((tmp_path / "witness.json").read_text())
    trace = read_trace(tmp_path / "t.parquet")
    mallocs = trace.events.op == Op.MALLOC
    assert trace.meta.source == Source.RMM
    info = trace.meta.extra["rmm_record"]
    # RMM answers a 0-byte request with nullptr (no row); its statistics count the request
    assert int(mallocs.sum()) + info["null_allocations"] == witness["total_count"], (info, witness)
    assert witness["total_count"] > 100
    assert int(trace.events.size[mallocs].sum()) == witness["total_bytes"]


def test_record_rmm_of_cupy_on_rmms_default_resource(tmp_path: Path) -> None:
    """No resource set by the program: RMM's own default (a cudaMalloc per allocation) is logged."""
    program = """
        import json, sys
        import cupy as cp
        from rmm.allocators.cupy import rmm_cupy_allocator
        cp.cuda.set_allocator(rmm_cupy_allocator)
        xs = [cp.arange(1000 * (i + 1), dtype=cp.float64) for i in range(10)]
        total = float(sum(float(x.sum()) for x in xs))
        json.dump({"n": len(xs)}, open(sys.argv[1], "w"))
    """
    done = _record(tmp_path, program, "--rmm", "-o", "t.parquet")
    _keep(tmp_path, "cupy-default")
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    ev = trace.events
    sizes = sorted(int(s) for s in ev.size[ev.op == Op.MALLOC])
    assert trace.meta.source == Source.RMM
    assert [8000 * (i + 1) for i in range(10)] == [s for s in sizes if s % 8000 == 0 and s <= 80000][:10]
