"""Invariants of the ``cupy`` pool model on random request sequences (hypothesis).

After every event: live blocks never overlap and each lies inside device
memory the pool holds (checked from the replay's own output rows); at the end
of every prefix the chunk store is sound (``check_state``: pieces tile each
allocation, allocated + free == reserved, no two adjacent free pieces, trees
and lists consistent); and an OOM is reported only when no placement existed:
no free chunk of the stream fits and the limit leaves no room after releasing.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.sim.base import SimConfig, Stat, Status
from tracekit.sim.chunk_check import check_state
from tracekit.trace import Events, Op, Source, Trace, TraceMeta
from tracekit.trace.validate import pair_events

KIB = 1024


def build(steps) -> Trace:
    """Rows from steps: ("m", size, stream) allocates, ("f", k) frees the k-th live block (mod
    count), ("r",) is a recorded release point."""
    op, size, addr, stream = [], [], [], []
    live: list[int] = []
    nxt = 1
    for s in steps:
        if s[0] == "r":  # a recorded release (empty_cache / free_all_blocks): a segment_free row
            op.append(Op.SEGMENT_FREE)
            size.append(0)
            addr.append(0)
            stream.append(0)
            continue
        if s[0] == "m" or not live:
            sz = s[1] if s[0] == "m" else 1
            op.append(Op.MALLOC)
            size.append(sz)
            addr.append(nxt)
            stream.append(s[2] if s[0] == "m" else 0)
            live.append(nxt)
            nxt += 1
        else:
            a = live.pop(s[1] % len(live))
            op.append(Op.FREE)
            size.append(0)
            addr.append(a)
            stream.append(0)
    ev = Events.build(np.array(op, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64),
                      stream=np.array(stream, np.uint64))
    mate = pair_events(ev.op, ev.addr, ev.device, ev.seq).mate
    return Trace(None, TraceMeta.new(Source.SYNTHETIC), ev, mate, None, ())


def check_outputs(trace: Trace, r) -> None:
    """Replay the output rows and placements in order; assert no overlap and containment."""
    ev = trace.events
    segs: dict[int, int] = {}
    live: dict[int, tuple[int, int]] = {}  # malloc index -> (addr, bytes)
    rows = np.argsort(r.rows_before, kind="stable")
    k = 0
    for i in range(len(ev)):
        while k < len(rows) and r.rows_before[rows[k]] <= i:
            j = rows[k]
            a, s = int(r.rows_addr[j]), int(r.rows_size[j])
            if r.rows_op[j] == Op.SEGMENT_ALLOC:
                assert all(a + s <= b or b + t <= a for b, t in segs.items()), "device allocations overlap"
                segs[a] = s
            else:
                assert segs.pop(a) == s
                assert not any(a <= b < a + s for b, _ in live.values()), "released memory holds a block"
            k += 1
        if r.status[i] != Status.DONE:
            continue
        if ev.op[i] == Op.MALLOC and r.rounded[i] > 0:
            a, s = int(r.addr[i]), int(r.rounded[i])
            assert all(a + s <= b or b + t <= a for b, t in live.values()), f"block {i} overlaps"
            covered = sorted((b, b + t) for b, t in segs.items())
            end = a
            for lo, hi in covered:
                if lo <= end < hi:
                    end = hi
            assert end >= a + s, f"block {i} is not inside device memory the pool holds"
            live[i] = (a, s)
        elif ev.op[i] == Op.FREE:
            live.pop(int(trace.mate[i]), None)


sizes = st.one_of(st.integers(1, 4 * KIB), st.integers(1, 3 << 20), st.sampled_from([512, 1024, 4096]))
step = st.one_of(st.tuples(st.just("m"), sizes, st.sampled_from([0, 0, 0, 7])),
                 st.tuples(st.just("f"), st.integers(0, 1000)), st.tuples(st.just("r")))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=60),
       limit=st.one_of(st.none(), st.integers(1, 16).map(lambda m: m << 20)))
def test_cupy_invariants(steps, limit):
    from tracekit.sim.policies.cupy_pool import MODEL

    trace = build(steps)
    cfg = SimConfig(limit, None, True)
    r, C, S = MODEL.run_with_state(trace, cfg)
    check_outputs(trace, r)
    assert check_state(C, S) == 0
    for cut in range(1, len(steps), 7):
        sub = trace_prefix(trace, cut)
        assert check_state(*MODEL.run_with_state(sub, cfg)[1:]) == 0
    if r.stats[Stat.OOMS]:
        first = int(r.stats[Stat.FIRST_OOM])
        s = int(r.stats[Stat.OOM_ROUNDED])
        assert r.stats[Stat.OOM_LARGEST] < s  # no free chunk of the stream fits
        assert limit is not None and r.stats[Stat.OOM_RESERVED] + s > limit  # and no room to grow
        assert r.status[first] == Status.OOM


def trace_prefix(trace: Trace, n: int) -> Trace:
    ev = trace.events.take(slice(0, n))
    mate = pair_events(ev.op, ev.addr, ev.device, ev.seq).mate
    return Trace(None, trace.meta, ev, mate, None, ())
