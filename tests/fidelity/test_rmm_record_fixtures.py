"""The committed ``record --rmm`` traces of real programs (``traces/rmm-record``, recorded on a GPU with
RMM 26.10) against what the programs' own RMM statistics counted, and RMM's pool model against the
real pool's failure.

``cupy-pool``: a CuPy program on ``rmm_cupy_allocator`` over ``rmm.reinitialize(pool_allocator=True,
initial_pool_size=0, maximum_pool_size=512 MiB)`` with RMM's ``StatisticsResourceAdaptor`` over it,
filling the pool with 48 MiB blocks until RMM raised ``MemoryError``. ``torch``: torchvision's
ResNet-18, three training steps on ``rmm_torch_allocator``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tracekit.sim.base import SimConfig
from tracekit.sim.codes import Stat
from tracekit.sim.policies.rmm_pool import MODEL
from tracekit.trace import Op, Source, read_trace
from tracekit.trace.live import live_bytes, paired_frees

HERE = Path(__file__).resolve().parents[2] / "traces" / "rmm-record"


def test_the_cupy_program_on_rmms_pool_holds_what_rmm_counted() -> None:
    trace = read_trace(HERE / "cupy-pool.parquet")
    witness = json.loads((HERE / "cupy-pool.witness.json").read_text())
    ev = trace.events
    mallocs = ev.op == Op.MALLOC
    assert trace.meta.source == Source.RMM
    assert int(mallocs.sum()) == witness["total_count"] == 249
    assert int(ev.size[mallocs].sum()) == witness["total_bytes"]
    freed = paired_frees(ev.op, trace.mate)  # requested bytes live after every row
    assert int(live_bytes(ev.size, mallocs, freed, trace.mate).max()) == witness["peak_bytes"]
    assert trace.meta.pool_limit_bytes == 512 << 20 and trace.meta.recorded.rmm_pool.initial_bytes == 0
    assert trace.meta.recorded.exit is not None and trace.meta.recorded.exit.status == "ok"  # it caught it


def test_rmms_pool_model_fails_where_the_real_pool_failed() -> None:
    trace = read_trace(HERE / "cupy-pool.parquet")
    real = int(trace.events.seq[np.flatnonzero(trace.events.op == Op.OOM)[0]])
    # the initial pool: the program's own, as recorded (0); the maximum: the trace's pool limit
    run = MODEL.run(trace, SimConfig(capacity=trace.meta.pool_limit_bytes, stop_at_first_oom=True))
    assert int(run.stats[Stat.FIRST_OOM]) == real == 487
    # and the answer the verb gives: fragmentation, more free in the pool than asked, no block of it
    cmd = [sys.executable, "-m", "tracekit", "replay", str(HERE / "cupy-pool.parquet"), "--sim", "rmm-pool",
           "--stop-at-first-oom", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    oom = json.loads(out.stdout)["oom"]
    assert oom["seq"] == 487 and oom["cause"] == "fragmentation"
    assert oom["free_bytes"] > oom["size"] > oom["largest_free_block"]


def test_the_pytorch_program_on_rmms_allocator_holds_what_rmm_counted() -> None:
    trace = read_trace(HERE / "torch.parquet")
    witness = json.loads((HERE / "torch.witness.json").read_text())
    mallocs = trace.events.op == Op.MALLOC
    info = trace.meta.extra["rmm_record"]
    # RMM answers a 0-byte request with nullptr (no row) and its statistics count it
    assert int(mallocs.sum()) + info["null_allocations"] == witness["total_count"] == 1112
    assert int(trace.events.size[mallocs].sum()) == witness["total_bytes"]
