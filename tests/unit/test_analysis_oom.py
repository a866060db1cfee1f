"""Hand-built traces whose summary and OOM verdict are worked out in the comments."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tracekit.analysis import Diagnosis, analyze_trace, pool_state_at
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta
from tracekit.trace.reader import Trace
from tracekit.trace.validate import pair_events

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
SEG = 0x7F00_0000_0000
SITES = ("model.py:10:forward", "model.py:20:backward", "data.py:5:load")


def trace_of(rows: list[tuple], meta: TraceMeta) -> Trace:
    """rows: (op, addr, size, rounded, site[, stream]) -> an in-memory Trace, paired like the reader."""
    op = np.array([r[0] for r in rows], np.int8)
    ev = Events.build(
        op, np.array([r[2] for r in rows], np.uint64), addr=np.array([r[1] for r in rows], np.uint64),
        rounded=np.array([r[3] for r in rows], np.uint64), site=np.array([r[4] for r in rows]),
        stream=np.array([r[5] if len(r) > 5 else 0 for r in rows], np.uint64), sites=SITES,
    )
    p = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    assert p.keep.all()
    return Trace(None, meta, ev, p.mate, None, ())


def test_fragmentation_oom():
    # One 10 MiB segment cut into A 3 | B 2 | C 3 | D 2 MiB; A and C are freed, so 6 MiB is
    # free in two 3 MiB holes. A 4 MiB request fits in the free bytes but in no hole.
    rows = [
        (Op.SEGMENT_ALLOC, SEG, 10 * MiB, 0, -1),
        (Op.MALLOC, SEG, 3 * MiB, 3 * MiB, 0),
        (Op.MALLOC, SEG + 3 * MiB, 2 * MiB - 100, 2 * MiB, 1),
        (Op.MALLOC, SEG + 5 * MiB, 3 * MiB, 3 * MiB, 0),
        (Op.MALLOC, SEG + 8 * MiB, 2 * MiB, 2 * MiB, 2),
        (Op.FREE, SEG, 3 * MiB, 0, -1),
        (Op.FREE, SEG + 5 * MiB, 3 * MiB, 0, -1),
        (Op.OOM, 0, 4 * MiB - 10, 4 * MiB, 0),
    ]
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=10 * MiB, device=DeviceInfo("H", 80 * GiB, 79 * GiB))
    s = analyze_trace(trace_of(rows, meta)).summary
    o = s.oom
    assert o is not None and o.seq == 7 and o.size == 4 * MiB - 10 and o.rounded == 4 * MiB
    assert (o.live_bytes, o.reserved_bytes, o.free_in_pool, o.largest_free_block) == (
        4 * MiB, 10 * MiB, 6 * MiB, 3 * MiB)
    assert o.device_free == 79 * GiB - 10 * MiB
    assert o.diagnosis is Diagnosis.FRAGMENTATION
    assert "6.00 MiB free" in o.explanation and "only 3.00 MiB" in o.explanation
    assert o.site == SITES[0]
    # B (site 1) and D (site 2) are live, 2 MiB each; ties go to the lower site index.
    assert [(t.site, t.bytes, t.blocks) for t in o.top_live_sites] == [
        (SITES[1], 2 * MiB, 1), (SITES[2], 2 * MiB, 1)]
    d = s.to_dict()["oom"]
    assert d["diagnosis"] == "fragmentation" and d["top_live_sites"][0]["bytes"] == 2 * MiB


def test_limit_oom():
    # Pool limit 8 MiB; one 6 MiB segment fully used; a 4 MiB request needs a new segment:
    # 6 + 4 = 10 MiB > 8 MiB while the device has 79 GiB - 6 MiB free: the limit binds.
    rows = [
        (Op.SEGMENT_ALLOC, SEG, 6 * MiB, 0, -1),
        (Op.MALLOC, SEG, 6 * MiB, 6 * MiB, 0),
        (Op.OOM, 0, 4 * MiB, 4 * MiB, 1),
    ]
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=8 * MiB, device=DeviceInfo("H", 80 * GiB, 79 * GiB))
    o = analyze_trace(trace_of(rows, meta)).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.LIMIT
    assert (o.free_in_pool, o.largest_free_block) == (0, 0)
    assert "10.00 MiB" in o.explanation and "pool limit of 8.00 MiB" in o.explanation
    assert "79.00 GiB" not in o.explanation and "78.99 GiB free" in o.explanation


def test_overhead_oom():
    # Raw device trace (no segments): total 1 GiB, 600 MiB free at start, so 424 MiB went to
    # the context (400 MiB) and another process (24 MiB). 500 MiB live + 200 MiB = 700 MiB fits
    # in 1 GiB but not in the 600 MiB that was left.
    rows = [
        (Op.MALLOC, 0x1000_0000, 300 * MiB, 300 * MiB, 0),
        (Op.MALLOC, 0x3000_0000, 200 * MiB, 200 * MiB, 1),
        (Op.OOM, 0, 200 * MiB, 200 * MiB, 2),
    ]
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("H", 1 * GiB, 600 * MiB)).with_extra(
        budget={"context_bytes": 400 * MiB, "other_processes_bytes": 24 * MiB, "name": "H"})
    s = analyze_trace(trace_of(rows, meta)).summary
    o = s.oom
    assert o is not None and o.diagnosis is Diagnosis.OVERHEAD
    assert (o.live_bytes, o.reserved_bytes, o.device_free) == (500 * MiB, 500 * MiB, 100 * MiB)
    assert "424.00 MiB" in o.explanation and "600.00 MiB" in o.explanation
    assert "this process's CUDA context, 400.00 MiB" in o.explanation
    d = s.to_dict()
    assert d["overhead_bytes"] == 424 * MiB and d["budget"]["context_bytes"] == 400 * MiB


def test_exhaustion_oom():
    # 900 MiB live on a 1 GiB device with nothing taken at start: 900 + 200 MiB > 1 GiB.
    rows = [(Op.MALLOC, 0x1000_0000, 900 * MiB, 900 * MiB, 0), (Op.OOM, 0, 200 * MiB, 200 * MiB, 1)]
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("H", 1 * GiB, 1 * GiB))
    o = analyze_trace(trace_of(rows, meta)).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.EXHAUSTION
    assert "1.07 GiB" in o.explanation and "1.00 GiB" in o.explanation


def test_exhaustion_without_any_device_facts():
    rows = [(Op.MALLOC, 0x1000, 5 * MiB, 5 * MiB, 0), (Op.OOM, 0, 1 * MiB, 1 * MiB, 0)]
    o = analyze_trace(trace_of(rows, TraceMeta.new(Source.SYNTHETIC))).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.EXHAUSTION
    assert o.device_free is None and "not recorded" in o.explanation


def test_free_space_on_another_stream_is_not_usable():
    # Stream 7 owns an empty 8 MiB segment; stream 0's 4 MiB segment is 1 MiB free | 2 MiB live |
    # 1 MiB free. A 2 MiB request on stream 0 finds 10 MiB free in the pool and an 8 MiB block,
    # but on its own stream the largest hole is 1 MiB.
    rows = [
        (Op.SEGMENT_ALLOC, SEG, 4 * MiB, 0, -1, 0),
        (Op.SEGMENT_ALLOC, SEG + 64 * MiB, 8 * MiB, 0, -1, 7),
        (Op.MALLOC, SEG + 1 * MiB, 2 * MiB, 2 * MiB, 0, 0),
        (Op.OOM, 0, 2 * MiB, 2 * MiB, 0, 0),
    ]
    o = analyze_trace(trace_of(rows, TraceMeta.new(Source.CUPY))).summary.oom
    assert o is not None and o.largest_free_block == 8 * MiB and o.free_in_pool == 10 * MiB
    assert o.diagnosis is Diagnosis.FRAGMENTATION
    assert "another stream" in o.explanation and "only 1.00 MiB" in o.explanation


def test_free_list_replay_is_diagnosed_against_its_heap():
    # A first-fit replay over a 10 KiB heap: blocks 4 | 2 | 4 KiB, the two 4 KiB freed;
    # a 6 KiB request has 8 KiB free but at most 4 KiB in one piece.
    rows = [
        (Op.SEGMENT_ALLOC, 0, 10 * KiB, 0, -1),
        (Op.MALLOC, 0, 4 * KiB, 4 * KiB, 0),
        (Op.MALLOC, 4 * KiB, 2 * KiB, 2 * KiB, 1),
        (Op.MALLOC, 6 * KiB, 4 * KiB, 4 * KiB, 0),
        (Op.FREE, 0, 4 * KiB, 0, -1),
        (Op.FREE, 6 * KiB, 4 * KiB, 0, -1),
        (Op.OOM, 0, 6 * KiB, 6 * KiB, 2),
    ]
    meta = TraceMeta.new(Source.REPLAY, pool_limit_bytes=10 * KiB).with_extra(
        policy="first-fit", capacity=10 * KiB)
    s = analyze_trace(trace_of(rows, meta)).summary
    assert s.oom is not None and s.oom.diagnosis is Diagnosis.FRAGMENTATION
    assert "the heap held 8.00 KiB free" in s.oom.explanation
    assert s.context.limit is None and s.context.heap_capacity == 10 * KiB
    # Without the holes it is exhaustion of the heap, not a limit.
    rows2 = [rows[0], (Op.MALLOC, 0, 8 * KiB, 8 * KiB, 0), (Op.OOM, 0, 4 * KiB, 4 * KiB, 2)]
    o = analyze_trace(trace_of(rows2, meta)).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.EXHAUSTION and "heap of 10.00 KiB" in o.explanation


def test_summary_figures_worked_by_hand():
    # ev  op             H (reserved)  Q (requested)  live (rounded)
    # 0   seg A 64 KiB   65536         0              0
    # 1   malloc A       65536         1000           1024
    # 2   free A         65536         0              0
    # 3   seg_free A     0             0              0
    # 4   seg B 8 KiB    8192          0              0
    # 5   malloc B       8192          3000           3072
    # 6   malloc B+3072  8192          7000           7168
    # 7   free B         8192          4000           4096   (holes 3072 and 1024)
    A, B = SEG, SEG + MiB
    rows = [
        (Op.SEGMENT_ALLOC, A, 65536, 0, -1), (Op.MALLOC, A, 1000, 1024, 0), (Op.FREE, A, 1024, 0, -1),
        (Op.SEGMENT_FREE, A, 65536, 0, -1), (Op.SEGMENT_ALLOC, B, 8192, 0, -1),
        (Op.MALLOC, B, 3000, 3072, 1), (Op.MALLOC, B + 3072, 4000, 4096, 2), (Op.FREE, B, 3072, 0, -1),
    ]
    r = analyze_trace(trace_of(rows, TraceMeta.new(Source.CUPY)))
    s = r.summary
    assert (s.peak_live_bytes, s.peak_live_seq) == (7168, 6)
    assert s.peak_requested_bytes == 7000
    assert (s.peak_reserved_bytes, s.peak_reserved_seq) == (65536, 0)
    assert s.max_external_fragmentation == pytest.approx(1 - 3072 / 4096)
    assert s.min_largest_free_block == 1024  # event 6: 1 KiB free, all in one piece
    # t_ns = 0..7: events 0..6 each last 1 ns, the last one 0 ns.
    assert s.jw1 == pytest.approx((65536 * 3 + 8192 * 3 - 11000) / 11000)
    assert s.jw2 == pytest.approx((8192 - 7000) / 7000)
    assert s.jw3 == pytest.approx((65536 - 1000) / 1000)  # the most requested while H peaked
    assert s.jw4 == pytest.approx((65536 - 7000) / 7000)
    assert s.oom is None and s.oom_events == 0
    assert [(x.site, x.bytes, x.blocks) for x in s.leaks] == [(SITES[2], 4096, 1)]
    assert (s.leaked_bytes, s.leaked_blocks) == (4096, 1)
    tl = r.timeline
    assert tl is not None
    assert tl.column("largest_free_block").to_pylist() == [65536, 64512, 65536, 0, 8192, 5120, 1024, 3072]
    assert tl.column("device_free").null_count == 8


def test_pool_state_at_rebuilds_segments_blocks_and_gaps():
    rows = [
        (Op.SEGMENT_ALLOC, SEG, 8192, 0, -1), (Op.MALLOC, SEG, 3000, 3072, 1),
        (Op.MALLOC, SEG + 3072, 4000, 4096, 2), (Op.FREE, SEG, 3072, 0, -1),
    ]
    tr = trace_of(rows, TraceMeta.new(Source.CUPY))
    st = pool_state_at(tr.events, tr.mate, 3)  # before the free: both blocks live
    assert st.block_addr.tolist() == [SEG, SEG + 3072] and st.seg_size.tolist() == [8192]
    seg, start, length = st.gaps()
    assert seg.tolist() == [0]
    assert start.tolist() == [SEG + 7168] and length.tolist() == [1024]
    end = pool_state_at(tr.events, tr.mate, len(tr.events))
    assert end.block_addr.tolist() == [SEG + 3072]
    assert end.gaps()[2].tolist() == [3072, 1024]


def test_torch_limit_counts_the_segment_it_must_allocate():
    # PyTorch: 16 MiB reserved and all in use, limit 30 MiB. A 2 MiB request needs a new 20 MiB
    # large-pool segment: 16 + 20 = 36 MiB > 30 MiB, although 16 + 2 = 18 MiB would fit.
    rows = [(Op.SEGMENT_ALLOC, SEG, 16 * MiB, 0, -1), (Op.MALLOC, SEG, 16 * MiB, 16 * MiB, 0),
            (Op.OOM, 0, 2 * MiB, 2 * MiB, 1)]
    meta = TraceMeta.new(Source.TORCH, pool_limit_bytes=30 * MiB, device=DeviceInfo("H", 80 * GiB, 79 * GiB))
    o = analyze_trace(trace_of(rows, meta)).summary.oom
    assert o is not None and o.diagnosis is Diagnosis.LIMIT
    assert "a new 20.00 MiB segment" in o.explanation and "36.00 MiB" in o.explanation


def test_jw1_is_weighted_by_how_long_each_state_lasts():
    # A 4096-byte segment; a 1000-byte block lives 1 s, then a 4000-byte block lives 9 s.
    # H = 4096 throughout; Q = 1000 for 1 s, 4000 for 9 s:
    # jw1 = (4096·10 − (1000·1 + 4000·9)) / (1000·1 + 4000·9). Per event it would differ.
    rows = [(Op.SEGMENT_ALLOC, SEG, 4096, 0, -1), (Op.MALLOC, SEG, 1000, 1024, 0),
            (Op.FREE, SEG, 1024, 0, -1), (Op.MALLOC, SEG, 4000, 4096, 1), (Op.FREE, SEG, 4096, 0, -1)]
    tr = trace_of(rows, TraceMeta.new(Source.CUPY))
    s_ = 1_000_000_000
    t = np.array([0, 0, s_, s_, 10 * s_], np.int64)
    timed = Trace(None, tr.meta, dataclasses.replace(tr.events, t_ns=t), tr.mate, None, ())
    q = 1000 * 1 + 4000 * 9
    assert analyze_trace(timed).summary.jw1 == pytest.approx((4096 * 10 - q) / q)
    # All events at one instant: averaged per event (Q = 0, 1000, 0, 4000, 0; H = 4096 each).
    flat = Trace(None, tr.meta, dataclasses.replace(tr.events, t_ns=np.zeros(5, np.int64)), tr.mate, None, ())
    assert analyze_trace(flat).summary.jw1 == pytest.approx((4096 * 5 - 5000) / 5000)
