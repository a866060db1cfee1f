"""The device budget at the OOM: hand-built v2 traces for each taker, with the numbers worked out.

The seed's scenario on an H200 (CUDA total T = 150,109,880,320 B): process 4242 holds
143,666,544,640 B (133.80 GiB) before recording starts and this process's context
548,995,072 B, so free at start F0 = T − 143,666,544,640 − 548,995,072 = 5,894,340,608 B.
The program takes an 8 MiB segment, launches a kernel that raises the stack limit from
1 KiB to 16 KiB per thread ((16384 − 1024) B × 132 SMs × 2048 threads = 4,152,360,960 B
= 3,960 MiB, exactly what the H200 measured), then asks for 512 MiB segments: three fit
(1,536 MiB), the fourth fails with F0 − 8 MiB − 3,960 MiB − 1,536 MiB = 122,978,304 B
(117.28 MiB) free.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracekit.analysis import Diagnosis, analyze_trace
from tracekit.analysis.oom_budget import FreeSource
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta
from tracekit.trace.reader import Trace
from tracekit.trace.validate import pair_events

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
T = 150_109_880_320
OTHER = 143_666_544_640
CONTEXT = 548_995_072
F0 = T - OTHER - CONTEXT
THREADS = 132 * 2048
LOCAL_GROWTH = (16384 - 1024) * THREADS
BASE = 0x7F00_0000_0000
HEAP, PRINTF = 8 * MiB, 8_650_752


def budget(others: list[dict], free0: int = F0, stack: int = 1024, heap: int = HEAP) -> dict:
    return {"device": 0, "cuda_total": T, "cuda_free": free0, "other_processes": others,
            "other_processes_bytes": sum(p["bytes"] for p in others), "context_bytes": CONTEXT,
            "stack_size": stack, "malloc_heap_size": heap, "printf_fifo_size": PRINTF, "sm_count": 132,
            "max_threads_per_sm": 2048, "cupy_pool_total_bytes": 0, "cupy_pool_used_bytes": 0}


def seed_trace(*, taken: int = LOCAL_GROWTH, others_start: list[dict] | None = None,
               others_oom: list[dict] | None = None, stack_after: int = 16384, heap_after: int = HEAP,
               exit_seq: int | None = 8, free_column: bool = True, free0: int = F0) -> Trace:
    """8 MiB + three 512 MiB segments, then a 512 MiB request that fails; ``taken`` bytes leave
    the device between seq 0 and seq 2 without the pool taking them."""
    segs = [8 * MiB, 512 * MiB, 512 * MiB, 512 * MiB]
    op, addr, size, free = [], [], [], []
    left = free0
    for i, s in enumerate(segs):
        if i == 1:
            left -= taken
        left -= s
        a = BASE + i * GiB
        op += [Op.SEGMENT_ALLOC, Op.MALLOC]
        addr += [a, a]
        size += [s, s]
        free += [left, -1]
    op.append(Op.OOM)
    addr.append(0)
    size.append(512 * MiB)
    free.append(left)
    ev = Events.build(np.array(op, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64),
                      rounded=np.array(size, np.uint64), site=np.array([-1] * 8 + [0]),
                      sites=("seed.py:30:main",))
    pool = sum(segs)
    others_start = [{"pid": 4242, "bytes": OTHER}] if others_start is None else others_start
    others_oom = [{"pid": 4242, "name": "python", "used_bytes": OTHER, "self": False}] \
        if others_oom is None else others_oom
    self_used = T - left - sum(p["used_bytes"] for p in others_oom)
    me = {"pid": 5151, "name": "python", "used_bytes": self_used, "self": True}
    limits = {"stack_size": stack_after, "malloc_heap_size": heap_after, "printf_fifo_size": PRINTF}
    state = {"seq": 8, "device": 0, "t_ns": 8, "mem_free": left, "mem_total": T,
             "processes": [*others_oom, me], "limits": limits,
             "pool": {"used_bytes": pool, "total_bytes": pool, "limit_bytes": None}}
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("NVIDIA H200", T, free0)).with_extra(
        budget=budget(others_start, free0), oom_states=[state], device_id=0,
        exit={"status": "exception", "exception": "cupy.cuda.memory.OutOfMemoryError", "code": 1,
              "signal": None, "oom_seq": exit_seq})
    p = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    extras = pa.table({"device_free": pa.array(free, pa.int64(), mask=np.array(free) < 0)}) \
        if free_column else None
    return Trace(None, meta, ev, p.mate, extras, ())


def test_seed_scenario_names_the_stack_limit_and_the_other_process():
    o = analyze_trace(seed_trace(), timeline=False).summary.oom
    assert o is not None and o.seq == 8 and not o.handled and o.device == 0
    left = F0 - 8 * MiB - LOCAL_GROWTH - 3 * 512 * MiB
    assert left == 122_978_304
    assert o.device_free == left and o.device_free_source is FreeSource.MEASURED
    assert o.diagnosis is Diagnosis.OVERHEAD
    e = o.explanation
    assert "failed with only 117.28 MiB free on the device (measured)" in e
    # The drop between seq 0 (after the 8 MiB segment) and seq 2 (after the first 512 MiB one)
    # is 3,960 + 512 MiB; the pool took 512 MiB of it.
    assert "the stack limit grew from 1 KiB to 16 KiB per thread between seq 0 and seq 2" in e
    assert "free fell by 3.87 GiB more than the pool took, measured" in e
    assert "reserving ≈ 3.87 GiB more for local memory (estimated: +15,360 B x 270,336 threads)" in e
    assert e.endswith("process 4242 (python) holds 133.80 GiB (measured; the largest taker).")
    d = analyze_trace(seed_trace(), timeline=False).summary.to_dict()["oom"]
    assert d["device_free_bytes"] == left and d["device_free_source"] == "measured"


def test_seed_budget_terms_add_up():
    o = analyze_trace(seed_trace(), timeline=False).summary.oom
    assert o is not None and o.budget is not None
    terms = {t.name: t for t in o.budget.terms}
    pool = 8 * MiB + 3 * 512 * MiB
    assert terms["pool reserved"].oom == pool and terms["pool reserved"].how_oom.value == "measured"
    assert terms["other processes"].start == OTHER and terms["other processes"].oom == OTHER
    assert terms["process 4242 (python)"].change == 0
    # Outside the pool: the context plus the local-memory growth, derived from NVML.
    assert terms["this process outside the pool"].oom == CONTEXT + LOCAL_GROWTH
    assert terms["local memory (model)"].start == 1024 * THREADS == 276_824_064
    assert terms["local memory (model)"].oom == 16384 * THREADS
    assert terms["local memory (model)"].change == LOCAL_GROWTH == 4_152_360_960
    # The rest of the context is the same before and after: only the stack changed.
    rest = terms["code, constants, driver (rest)"]
    assert rest.start == rest.oom == CONTEXT - 1024 * THREADS - HEAP - PRINTF == 255_131_648
    assert terms["unaccounted"].start == 0 and terms["unaccounted"].oom == 0
    assert all(t.how_oom.value in ("measured", "estimated", "derived") for t in o.budget.terms)


def test_another_process_started_after_recording_began():
    # Nothing else at start (free T - context); process 777 appears between seq 0 and seq 2
    # and takes OTHER + 3.5 GiB = 137.30 GiB, which leaves F0 - 3.5 GiB - 1544 MiB = 493.28 MiB.
    used = OTHER + 3584 * MiB
    tr = seed_trace(taken=used, others_start=[], stack_after=1024, free0=T - CONTEXT,
                    others_oom=[{"pid": 777, "name": "trainer", "used_bytes": used, "self": False}])
    o = analyze_trace(tr, timeline=False).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.OVERHEAD
    assert "with only 493.28 MiB free on the device (measured)" in o.explanation
    assert o.explanation.endswith(
        "process 777 (trainer) started using the device after recording began, between seq 0 and seq 2 "
        "(where free fell by 137.30 GiB more than the pool took, measured), and holds 137.30 GiB "
        "(measured; the largest taker).")
    assert "stack limit" not in o.explanation


def test_another_process_grew():
    # 3.5 GiB more for process 4242 leaves 493.28 MiB free: the 512 MiB request fails.
    grow = 3584 * MiB
    tr = seed_trace(taken=grow, stack_after=1024,
                    others_oom=[{"pid": 4242, "name": "python", "used_bytes": OTHER + grow, "self": False}])
    o = analyze_trace(tr, timeline=False).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.OVERHEAD
    assert "with only 493.28 MiB free on the device (measured)" in o.explanation
    assert "process 4242 (python) grew by 3.50 GiB to 137.30 GiB" in o.explanation


def test_malloc_heap_grew():
    # cudaLimitMallocHeapSize raised from 8 MiB to 3.5 GiB takes 3,576 MiB, which leaves
    # F0 - 8 MiB - 3,576 MiB - 1,536 MiB = 501.28 MiB: the 512 MiB request fails.
    tr = seed_trace(taken=3584 * MiB - 8 * MiB, stack_after=1024, heap_after=3584 * MiB)
    o = analyze_trace(tr, timeline=False).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.OVERHEAD
    assert "with only 501.28 MiB free on the device (measured)" in o.explanation
    assert ("the device malloc heap limit changed from 8.00 MiB to 3.50 GiB between seq 0 and seq 2"
            in o.explanation)
    terms = {t.name: t for t in o.budget.terms} if o.budget else {}
    assert terms["device malloc heap"].change == 3576 * MiB


def test_pool_limit_measured_at_the_oom():
    # The pool's own limit at the OOM (256 MiB + 1 GiB) is below reserved + request: `limit`,
    # although the metadata has no pool_limit_bytes.
    tr = seed_trace(taken=0, stack_after=1024)
    states = [dict(tr.meta.extra["oom_states"][0])]
    states[0]["pool"] = {"used_bytes": 1544 * MiB, "total_bytes": 1544 * MiB, "limit_bytes": 1800 * MiB}
    tr = Trace(None, tr.meta.with_extra(oom_states=states), tr.events, tr.mate, tr.extras, ())
    o = analyze_trace(tr, timeline=False).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.LIMIT
    assert "over its pool limit of 1.76 GiB" in o.explanation


def test_v1_trace_has_a_derived_free_never_called_measured():
    tr = seed_trace(free_column=False)
    meta = tr.meta.with_extra(oom_states=None, exit=None)
    o = analyze_trace(Trace(None, meta, tr.events, tr.mate, None, ()), timeline=False).summary.oom
    assert o is not None and o.device_free_source is FreeSource.DERIVED
    assert o.device_free == F0 - 1544 * MiB  # start free - the pool's growth: 3.98 GiB, not measured
    s = analyze_trace(Trace(None, meta, tr.events, tr.mate, None, ()), timeline=False).summary.to_text()
    assert "device free" in s and "not measured; free at start - the pool's growth = 3.98 GiB (derived" in s
    bare = Trace(None, TraceMeta.new(Source.CUPY), tr.events, tr.mate, None, ())
    o2 = analyze_trace(bare, timeline=False).summary.oom
    assert o2 is not None and o2.device_free is None and o2.device_free_source is FreeSource.UNKNOWN
    assert analyze_trace(bare).summary.to_dict()["oom"]["device_free_source"] == "unknown"


@pytest.mark.parametrize("extra", [
    {"oom_states": "x", "exit": [], "pools": 3},
    {"oom_states": [1, None, {"seq": "8"}, {"seq": 8, "processes": "x", "limits": [], "pool": 5}]},
    {"oom_states": [{"seq": 8, "mem_free": -1e30, "processes": [{"pid": True}, {"pid": 1, "used_bytes": 2.5}],
                     "limits": {"stack_size": -4}}]},
    {"exit": {"oom_seq": "8", "status": 3}, "pools": [{"device": True, "id": None}, None]},
    {"budget": {"other_processes": [{"pid": 1.5}, "x"], "sm_count": "132", "stack_size": None}},
    {"ooms": "x", "exit": {"message": ["m"], "exception": 5}},
    {"budget": {"sm_count": 2**62, "max_threads_per_sm": 2**62, "stack_size": 2**62, "cuda_free": 2**62}},
])
def test_malformed_recording_metadata_is_ignored_not_fatal(extra: dict):
    # Whatever a damaged or hostile recording holds, the analysis still gives a verdict; what it
    # cannot use is treated as not measured.
    tr = seed_trace(free_column=False)
    meta = tr.meta.with_extra(**extra)
    o = analyze_trace(Trace(None, meta, tr.events, tr.mate, None, ()), timeline=False).summary.oom
    assert o is not None and o.seq == 8 and o.diagnosis in tuple(Diagnosis)


def test_a_negative_free_figure_is_not_a_measurement():
    tr = seed_trace(free_column=False)
    state = dict(tr.meta.extra["oom_states"][0], mem_free=-5)
    meta = tr.meta.with_extra(oom_states=[state])
    o = analyze_trace(Trace(None, meta, tr.events, tr.mate, None, ()), timeline=False).summary.oom
    assert o is not None and o.device_free_source is FreeSource.DERIVED and o.device_free == F0 - 1544 * MiB
