"""The recorder on a real GPU: traces agree with the pool's own counters, the OOM is the one raised."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Op, Trace, read_trace

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
WORK = ROOT / "scripts" / "record_workloads.py"


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _record(tmp: Path, args: list[str], *opts: str) -> tuple[subprocess.CompletedProcess[str], Trace]:
    out = tmp / "t.parquet"
    cmd = [sys.executable, "-m", "tracekit", "record", *opts, "-o", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=240)
    assert out.exists(), p.stderr
    assert not Path(str(out) + ".spool").exists()
    return p, read_trace(out, strict=True)


def _live(t: Trace, upto: int, alloc: Op) -> int:
    """Bytes of ``alloc`` events at index < upto whose release is not before ``upto``."""
    ev, idx = t.events, np.arange(len(t.events))
    live = (ev.op == alloc) & (idx < upto) & ((t.mate < 0) | (t.mate >= upto))
    col = ev.rounded if alloc == Op.MALLOC else ev.size
    return int(col[live].sum())


def _check_end(t: Trace) -> None:
    end = t.meta.extra["pool_end"]["0"]
    n = len(t.events)
    assert _live(t, n, Op.MALLOC) == end["used_bytes"]
    assert _live(t, n, Op.SEGMENT_ALLOC) == end["total_bytes"]


def test_mlp_matches_pool_counters(tmp_path: Path) -> None:
    p, t = _record(tmp_path, [str(WORK), "mlp", "--steps", "60"])
    assert p.returncode == 0, p.stderr
    assert t.meta.extra["complete"] is True and t.meta.extra["exit"]["code"] == 0
    _check_end(t)
    assert t.events.count(Op.MALLOC) > 500 and t.events.count(Op.SEGMENT_ALLOC) > 0
    assert any("record_workloads.py" in s and ":run_mlp" in s for s in t.events.sites)
    assert t.meta.device is not None and t.meta.device.total_bytes
    assert "budget" in t.meta.extra and t.meta.versions["cupy"]
    assert set(t.meta.extra["device_limits"]) == {"stack_size", "printf_fifo_size", "malloc_heap_size"}
    assert f"Wrote {tmp_path / 't.parquet'}" in p.stderr


def test_oom_is_the_request_that_raised(tmp_path: Path) -> None:
    p, t = _record(tmp_path, [str(WORK), "oom"], "--limit", "256MiB")
    plain = subprocess.run([sys.executable, str(WORK), "oom"], capture_output=True, text=True,
                           env=_env(), timeout=240)
    assert p.returncode == plain.returncode == 1
    lines = p.stderr.strip().splitlines()
    msg = t.meta.extra["exit"]["message"]
    prefix = "cupy.cuda.memory.OutOfMemoryError: "
    assert f"{prefix}{msg}" in lines  # the program's own exception, unchanged
    assert plain.stderr.strip().splitlines()[-1].startswith(prefix + "Out of memory allocating")
    frames = [ln for ln in lines if ln.startswith("  File")]
    assert frames and not any(os.path.join("tracekit", d) in ln for ln in frames for d in ("record", "cli"))
    size = int(re.search(r"allocating ([\d,]+) bytes", msg).group(1).replace(",", ""))  # type: ignore[union-attr]
    ooms = t.meta.extra["ooms"]
    assert ooms and ooms[-1]["message"] == msg
    i = ooms[-1]["seq"]
    assert t.events.op[i] == Op.OOM and int(t.events.rounded[i]) == size
    line = next(n for n, s in enumerate(WORK.read_text().splitlines(), 1) if "work = cp.empty(" in s)
    assert t.events.site_name(i).endswith(f"record_workloads.py:{line}:run_oom")  # type: ignore[union-attr]
    # the pool's own figures at the failure agree with the trace up to that row
    assert _live(t, i, Op.MALLOC) == ooms[-1]["used_bytes"]
    assert _live(t, i, Op.SEGMENT_ALLOC) == ooms[-1]["total_bytes"]
    # fragmentation: more free bytes in the pool than the failed request
    assert ooms[-1]["free_bytes"] > size
    assert ooms[-1]["total_bytes"] + size > 256 * 2**20
    _check_end(t)


def test_worker_thread_events_are_recorded(tmp_path: Path) -> None:
    p, t = _record(tmp_path, [str(WORK), "threads", "--steps", "20"])
    assert p.returncode == 0, p.stderr
    sites = [t.events.sites[s] for s in set(t.events.site[t.events.op == Op.MALLOC]) if s >= 0]
    assert any(s.endswith(":run_threads.<locals>.worker") for s in sites), sites
    assert any(s.endswith(":run_threads.<locals>.<listcomp>") or s.endswith(":run_threads")
               for s in sites), sites
    _check_end(t)


def test_programs_own_pool_calls_act_on_recorded_pool(tmp_path: Path) -> None:
    script = tmp_path / "app.py"
    script.write_text(
        "import cupy as cp\n"
        "pool = cp.get_default_memory_pool()\n"
        "a = cp.empty(10 * 2**20, cp.uint8)\n"
        "assert pool.used_bytes() == 10 * 2**20, pool.used_bytes()\n"
        "del a\n"
        "pool.free_all_blocks()\n"
        "assert pool.total_bytes() == 0\n"
        "print('ok')\n"
    )
    p, t = _record(tmp_path, [str(script)], "--no-sites")
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr
    seg = t.events.op == Op.SEGMENT_FREE
    assert seg.sum() == 1 and int(t.events.size[seg][0]) == 10 * 2**20
    assert t.events.sites == () and t.meta.extra["recorder"]["call_sites"] is False
    _check_end(t)


def test_fft_uses_two_streams(tmp_path: Path) -> None:
    p, t = _record(tmp_path, [str(WORK), "fft", "--steps", "24"])
    assert p.returncode == 0, p.stderr
    assert len(np.unique(t.events.stream[t.events.op == Op.MALLOC])) >= 2
    _check_end(t)
