"""The analyzer on real traces recorded on an H200, against what the real allocators reported.

CuPy traces carry the pool's own counters (``pool_end``: used/total bytes at the end; ``ooms``:
the counters when OutOfMemoryError was raised). PyTorch snapshots come with a ``.meta.json``
whose ``steps`` hold ``torch.cuda.max_memory_reserved()`` after each training step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.analysis import Diagnosis, analyze_trace
from tracekit.trace import read_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"
CUPY = sorted(TRACES.glob("cupy-*.parquet"))
TORCH_STEPS = [p for p in sorted(TRACES.glob("torch-*.parquet"))
               if p.with_suffix(".meta.json").exists()
               and json.loads(p.with_suffix(".meta.json").read_text()).get("steps")]
MiB, GiB = 1 << 20, 1 << 30


def test_real_traces_are_present():
    assert CUPY and TORCH_STEPS


@pytest.mark.parametrize("path", CUPY, ids=lambda p: p.stem)
def test_cupy_end_state_equals_the_pools_counters(path: Path):
    tr = read_trace(path)
    tl = analyze_trace(tr).timeline
    assert tl is not None
    end = tr.meta.extra["pool_end"][str(int(tr.events.device[0]))]
    assert tl.column("reserved_bytes")[-1].as_py() == end["total_bytes"]
    assert tl.column("live_bytes")[-1].as_py() == end["used_bytes"]


def test_cupy_fragmentation_oom_matches_the_pool_at_the_failure():
    tr = read_trace(TRACES / "cupy-oom-frag.parquet")
    s = analyze_trace(tr, timeline=False).summary
    (reported,) = tr.meta.extra["ooms"]
    o = s.oom
    assert o is not None and o.seq == reported["seq"] and o.rounded == reported["rounded"]
    assert o.reserved_bytes == reported["total_bytes"] and o.live_bytes == reported["used_bytes"]
    # The pool never held more than at the failure ("allocated so far" in CuPy's message).
    assert s.peak_reserved_bytes == reported["total_bytes"]
    assert o.diagnosis is Diagnosis.FRAGMENTATION
    assert o.free_in_pool == reported["free_bytes"] > o.rounded > o.largest_free_block == 56 * MiB


@pytest.mark.parametrize("path", TORCH_STEPS, ids=lambda p: p.stem)
def test_torch_peak_reserved_equals_max_memory_reserved(path: Path):
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    s = analyze_trace(read_trace(path), timeline=False).summary
    assert s.peak_reserved_bytes == max(step["peak_reserved"] for step in meta["steps"])


def test_torch_oom_is_the_memory_fraction_limit():
    path = TRACES / "torch-oom.parquet"
    meta = json.loads(path.with_suffix(".meta.json").read_text())
    s = analyze_trace(read_trace(path), timeline=False).summary
    o = s.oom
    assert o is not None and o.rounded == meta["oom_observer"]["alloc_size"]
    assert s.context.limit == meta["allowed_bytes"]
    assert o.diagnosis is Diagnosis.LIMIT
    # PyTorch's message: 11.39 GiB allocated + 823.30 MiB reserved but unallocated.
    assert abs(o.reserved_bytes - (11.39 * GiB + 823.30 * MiB)) < 0.01 * GiB
