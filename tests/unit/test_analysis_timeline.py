"""The compiled timeline against a slow, obviously-correct pure-Python reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis import TIMELINE_COLUMNS, analyze_trace
from tracekit.trace import Events, Op, Source, TraceMeta
from tracekit.trace.reader import Trace
from tracekit.trace.validate import pair_events

UNIT = 512
SLOT = 16  # units per segment slot; slots are adjacent, so full-size segments touch


def make_trace(rows: list[tuple[int, int, int, int, int]], meta: TraceMeta | None = None) -> Trace:
    """rows: (op, addr, size, rounded, device) -> an in-memory Trace, paired like the reader does."""
    op = np.array([r[0] for r in rows], np.int8)
    ev = Events.build(
        op, np.array([r[2] for r in rows], np.uint64), addr=np.array([r[1] for r in rows], np.uint64),
        rounded=np.array([r[3] for r in rows], np.uint64), device=np.array([r[4] for r in rows], np.int16),
    )
    p = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    assert p.keep.all()
    return Trace(None, meta or TraceMeta.new(Source.SYNTHETIC), ev, p.mate, None, ())


def reference(rows: list[tuple[int, int, int, int, int]], merge: bool = False) -> dict[str, list]:
    """Per event, recomputed from scratch: sums over live sets and gaps inside each segment.

    Every row reports its own device's state: devices are never summed together, and a
    device without segment rows is a raw device (reserved = live). ``merge``: touching
    segments of one device form one free space (expandable segments).
    """
    all_blocks: dict[tuple[int, int], tuple[int, int]] = {}  # (dev, addr) -> (rounded, requested)
    all_segs: dict[tuple[int, int], int] = {}
    pooled_devs = {r[4] for r in rows if r[0] in (Op.SEGMENT_ALLOC, Op.SEGMENT_FREE)}
    out: dict[str, list] = {c: [] for c in ("live", "req", "res", "lfb")}
    for o, addr, size, rounded, dev in rows:
        blocks, segs = all_blocks, all_segs
        if o == Op.MALLOC:
            blocks[(dev, addr)] = (rounded, size)
        elif o == Op.FREE:
            del blocks[(dev, addr)]
        elif o == Op.SEGMENT_ALLOC:
            segs[(dev, addr)] = size
        elif o == Op.SEGMENT_FREE:
            del segs[(dev, addr)]
        blocks = {k: v for k, v in all_blocks.items() if k[0] == dev}
        segs = {k: v for k, v in all_segs.items() if k[0] == dev}
        live = sum(b[0] for b in blocks.values())
        out["live"].append(live)
        out["req"].append(sum(b[1] for b in blocks.values()))
        out["res"].append(sum(segs.values()) if dev in pooled_devs else live)
        extents: list[tuple[int, int, int]] = []
        for sd, s0 in sorted(segs):
            if merge and extents and extents[-1][0] == sd and extents[-1][2] == s0:
                extents[-1] = (sd, extents[-1][1], s0 + segs[(sd, s0)])
            else:
                extents.append((sd, s0, s0 + segs[(sd, s0)]))
        best = 0
        for sd, s0, s1 in extents:
            covered = sorted((a, a + r) for (d, a), (r, _) in blocks.items() if d == sd)
            cur = s0
            for a, e in covered:
                if e <= cur or a >= s1:
                    continue
                best = max(best, min(a, s1) - cur)
                cur = max(cur, e)
            best = max(best, s1 - cur)
        out["lfb"].append(best)
    return out


@st.composite
def pooled_rows(draw: st.DrawFn) -> list[tuple[int, int, int, int, int]]:
    """A consistent pooled trace: segments in adjacent slots, blocks placed in free units."""
    n_slots = draw(st.integers(1, 5))
    n_dev = draw(st.integers(1, 2))
    seg: dict[tuple[int, int], int] = {}  # (dev, slot) -> units
    used: dict[tuple[int, int], list[tuple[int, int, int]]] = {}  # -> [(unit, units, requested)]
    rows: list[tuple[int, int, int, int, int]] = []
    for _ in range(draw(st.integers(1, 60))):
        dev = draw(st.integers(0, n_dev - 1))
        slot = draw(st.integers(0, n_slots - 1))
        key = (dev, slot)
        base = (1 << 20) + slot * SLOT * UNIT
        action = draw(st.sampled_from(["seg", "malloc", "malloc", "free", "free", "oom"]))
        if key not in seg:
            if action in ("seg", "malloc"):
                units = draw(st.sampled_from([SLOT, SLOT, draw(st.integers(1, SLOT))]))
                seg[key], used[key] = units, []
                rows.append((Op.SEGMENT_ALLOC, base, units * UNIT, 0, dev))
            continue
        blocks = used[key]
        if action == "malloc":
            taken = {u for b in blocks for u in range(b[0], b[0] + b[1])}
            start = draw(st.integers(0, seg[key] - 1))
            if start in taken:
                continue
            length = 1
            while start + length < seg[key] and start + length not in taken and draw(st.booleans()):
                length += 1
            req = length * UNIT - draw(st.integers(0, UNIT - 1))
            blocks.append((start, length, req))
            rows.append((Op.MALLOC, base + start * UNIT, req, length * UNIT, dev))
        elif action == "free" and blocks:
            b = blocks.pop(draw(st.integers(0, len(blocks) - 1)))
            rows.append((Op.FREE, base + b[0] * UNIT, b[1] * UNIT, 0, dev))
        elif action == "free" or action == "seg":
            if not blocks:
                rows.append((Op.SEGMENT_FREE, base, seg.pop(key) * UNIT, 0, dev))
        elif action == "oom":
            req = draw(st.integers(1, 4 * SLOT * UNIT))
            rows.append((Op.OOM, 0, req, -(-req // UNIT) * UNIT, dev))
    return rows


def check(rows: list[tuple[int, int, int, int, int]], merge: bool = False) -> None:
    meta = TraceMeta.new(Source.TORCH).with_extra(torch_allocator_settings={"expandable_segments": merge})
    tl = analyze_trace(make_trace(rows, meta)).timeline
    assert tl is not None and tuple(tl.column_names) == TIMELINE_COLUMNS
    ref = reference(rows, merge)
    got = {k: tl.column(c).to_pylist() for k, c in (
        ("live", "live_bytes"), ("req", "requested_bytes"), ("res", "reserved_bytes"),
        ("lfb", "largest_free_block"))}
    assert got == ref
    free = np.array(ref["res"]) - np.array(ref["live"])
    assert tl.column("free_in_pool").to_pylist() == free.tolist()
    expect = [1 - g / f if f > 0 else 0.0 for g, f in zip(ref["lfb"], free, strict=True)]
    assert np.allclose(tl.column("external_fragmentation").to_numpy(), expect)


@settings(max_examples=150, deadline=None)
@given(pooled_rows())
def test_timeline_matches_reference_on_pooled_traces(rows):
    if rows:
        check(rows)


@settings(max_examples=100, deadline=None)
@given(pooled_rows())
def test_timeline_matches_reference_with_expandable_segments(rows):
    if rows:
        check(rows, merge=True)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 5000)), min_size=1, max_size=40))
def test_raw_device_trace_reserved_equals_live(ops):
    rows: list[tuple[int, int, int, int, int]] = []
    live: list[int] = []
    nxt = 1 << 30
    for is_free, size in ops:
        if is_free and live:
            a = live.pop(0)
            rows.append((Op.FREE, a, 512, 0, 0))
        else:
            rows.append((Op.MALLOC, nxt, size, 512 if size <= 512 else -(-size // 512) * 512, 0))
            live.append(nxt)
            nxt += 1 << 20
    rows = [(o, a, s, r if o == Op.MALLOC else 0, d) for o, a, s, r, d in rows]
    # a free carries the block's rounded size
    sizes = {a: r for o, a, s, r, d in rows if o == Op.MALLOC}
    rows = [(o, a, sizes[a] if o == Op.FREE else s, r, d) for o, a, s, r, d in rows]
    check(rows)
    tl = analyze_trace(make_trace(rows)).timeline
    assert tl is not None
    assert tl.column("reserved_bytes").to_pylist() == tl.column("live_bytes").to_pylist()
    assert set(tl.column("free_in_pool").to_pylist()) == {0}


def test_adjacent_segments_do_not_merge_their_free_space():
    # Two 8 KiB segments back to back, both empty: 16 KiB free but the largest block is 8 KiB.
    rows = [(Op.SEGMENT_ALLOC, 0x10000, 8192, 0, 0), (Op.SEGMENT_ALLOC, 0x12000, 8192, 0, 0)]
    tl = analyze_trace(make_trace(rows)).timeline
    assert tl is not None
    assert tl.column("largest_free_block").to_pylist() == [8192, 8192]
    assert tl.column("external_fragmentation").to_pylist() == [0.0, 0.5]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 2, 511, 512, 2**63, 2**64 - 2, 2**64 - 1]) | st.integers(0, 2**64 - 1),
                max_size=9000))
def test_compress_sorts_and_indexes_like_numpy(values):
    from tracekit.analysis.compress import compress

    v = np.array(values, np.uint64)
    pts, idx = compress(v)
    expect, inv = np.unique(v, return_inverse=True)
    assert pts.tolist() == expect.tolist() and idx.tolist() == inv.ravel().tolist()


def test_segment_freed_with_live_blocks_drops_its_gaps():
    # Malformed on purpose: the 8 KiB segment goes while a block in its middle is live.
    rows = [(Op.SEGMENT_ALLOC, 0x10000, 8192, 0, 0), (Op.MALLOC, 0x11000, 512, 512, 0),
            (Op.SEGMENT_ALLOC, 0x40000, 2048, 0, 0), (Op.SEGMENT_FREE, 0x10000, 8192, 0, 0)]
    tl = analyze_trace(make_trace(rows)).timeline
    assert tl is not None
    assert tl.column("largest_free_block").to_pylist() == [8192, 4096, 4096, 2048]
