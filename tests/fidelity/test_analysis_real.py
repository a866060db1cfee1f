"""The analyzer on real traces recorded on an H200, against what the real allocators reported.

CuPy traces carry the pool's own counters (``pool_end``: used/total bytes at the end; ``ooms``:
the counters when OutOfMemoryError was raised). PyTorch snapshots come with a ``.meta.json``
whose ``steps`` hold ``torch.cuda.max_memory_reserved()`` after each training step.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tracekit.analysis import Diagnosis, analyze_trace
from tracekit.trace import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
CUPY = sorted(TRACES.glob("cupy-*.parquet"))
TORCH_STEPS = [p for p in sorted(TRACES.glob("torch-*.parquet"))
               if p.with_suffix(".meta.json").exists()
               and json.loads(p.with_suffix(".meta.json").read_text()).get("steps")]
MiB, GiB = 1 << 20, 1 << 30


def test_real_traces_are_present():
    assert CUPY and TORCH_STEPS


@pytest.mark.parametrize("path", CUPY, ids=lambda p: p.stem)
def test_cupy_end_state_equals_the_pools_counters(path: Path):
    # Version 2 recordings list every pool (``pools``) with its counters at the end
    # (``pools_end``, same order); the trace's rows of a device are all of its pools together.
    # An async pool's own cache is never in the trace (its rows are device allocations), so only
    # its bytes in use are compared.
    tr = read_trace(path)
    tl = analyze_trace(tr).timeline
    assert tl is not None
    extra = tr.meta.extra
    if "pools_end" in extra:
        ends = list(zip(extra["pools"], extra["pools_end"], strict=True))
        reserved = sum(e["total_bytes"] for p, e in ends if p["kind"] == "pool")
        used = sum(e["used_bytes"] for _, e in ends)
    else:
        end = extra["pool_end"][str(int(tr.events.device[0]))]
        reserved, used = end["total_bytes"], end["used_bytes"]
    if any(p["kind"] == "pool" for p in extra.get("pools", [{"kind": "pool"}])):
        assert tl.column("reserved_bytes")[-1].as_py() == reserved
    assert tl.column("live_bytes")[-1].as_py() == used


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


def _within(estimate: int, measured: int, share: float = 0.02) -> bool:
    return abs(estimate - measured) <= share * measured


def test_seed_scenario_names_both_takers_with_measured_numbers():
    # The seed's situation recorded on the H200 (scripts/seed_scenario.py): a helper process
    # takes all but 6 GiB, the program fills 8 MiB, a kernel with 16 KiB of local memory per
    # thread raises the stack limit, then 512 MiB arrays until CuPy raises.
    from tracekit.analysis.oom_budget import FreeSource
    from tracekit.units import format_size

    tr = read_trace(TRACES / "cupy-seed.parquet")
    extra = tr.meta.extra
    an = analyze_trace(tr)
    o = an.summary.oom
    assert o is not None and o.seq == extra["exit"]["oom_seq"] and not o.handled
    assert o.diagnosis is Diagnosis.OVERHEAD
    (state,) = extra["oom_states"]
    # The device free printed is cudaMemGetInfo at the raise, not free at start - the pool.
    assert o.device_free_source is FreeSource.MEASURED and o.device_free == state["mem_free"]
    assert f"only {format_size(state['mem_free'])} free on the device (measured)" in o.explanation
    # Where the explanation places the stack growth, the device free measured at the pool's
    # segment rows fell by the launch's reservation plus the segment; the estimate
    # (16384 - 1024) B x 132 SMs x 2048 threads is within 2% of that drop, and of the
    # 3,960 MiB a launch took in docs/budget.md.
    m = re.search(r"stack limit grew from 1 KiB to 16 KiB per thread between seq (\d+) and seq (\d+)",
                  o.explanation)
    assert m is not None
    a, b = (int(x) for x in m.groups())
    tl = an.timeline
    assert tl is not None
    free = dict(zip(tl.column("seq").to_pylist(), tl.column("device_free_measured").to_pylist(), strict=True))
    res = dict(zip(tl.column("seq").to_pylist(), tl.column("reserved_bytes").to_pylist(), strict=True))
    drop = (free[a] - free[b]) - (res[b] - res[a])
    assert o.budget is not None
    local = {t.name: t for t in o.budget.terms}["local memory (model)"].change
    assert local is not None and _within(local, drop) and _within(local, 3960 * MiB)
    assert f"reserving ≈ {format_size(local)} more for local memory" in o.explanation
    # The other process: NVML's figure for it, and the drop in free the trace measured when it
    # took the memory (before the first row), within 2% of each other.
    (other,) = [p for p in state["processes"] if not p["self"]]
    assert f"process {other['pid']} (" in o.explanation
    assert f"holds {format_size(other['used_bytes'])} (measured; the largest taker)" in o.explanation
    first = tl.column("device_free_measured")[0].as_py()
    assert _within(other["used_bytes"], tr.meta.device.free_bytes - first - res[0])


def test_torch_run_with_handled_ooms_and_a_fatal_one():
    # A ResNet-50 under a 3% memory fraction (scripts/torch_workload_resnet.py): requests at
    # one convolution call-site fail and are retried at half the size by the caller (handled),
    # then a later request fails for good.
    tr = read_trace(TRACES / "torch-handled-oom.parquet")
    s = analyze_trace(tr, timeline=False).summary
    o = s.oom
    assert o is not None and o.seq == tr.meta.extra["exit"]["oom_seq"] and not o.handled
    assert s.oom_events >= 2 and [x.seq for x in s.ooms if not x.handled] == [o.seq]
    d = s.to_dict()
    assert d["handled_ooms"] == s.oom_events - 1 == sum(h["count"] for h in d["handled_by"])
    # Each handled request was followed by a smaller one from the same call-site.
    assert all(x.handler is not None for x in s.ooms if x.handled)
    # The measured free memory at the OOM, and the pool's bytes, are PyTorch's own figures in
    # its message ("of which 134.93 GiB is free", "3.76 GiB is allocated by PyTorch, and
    # 356.65 MiB is reserved by PyTorch but unallocated"), to their two decimals.
    msg = tr.meta.extra["exit"]["message"]
    assert o.device_free == tr.meta.extra["oom_states"][-1]["mem_free"]
    assert o.device_free_source.value == "measured"
    free = re.search(r"of which ([\d.]+) GiB is free", msg)
    held = re.search(r"([\d.]+) GiB is allocated by PyTorch, and ([\d.]+) MiB is reserved", msg)
    assert free is not None and held is not None
    assert abs(o.device_free - float(free.group(1)) * GiB) <= 0.005 * GiB
    reserved = float(held.group(1)) * GiB + float(held.group(2)) * MiB
    assert abs(o.reserved_bytes - reserved) <= 0.01 * GiB
