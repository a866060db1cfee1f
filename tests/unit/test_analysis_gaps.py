"""PoolState.gaps against a unit-by-unit reference on random pool layouts."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis.leaks import PoolState

U = 512


def _reference(segs: list[tuple[int, int, int]], blocks: list[tuple[int, int]], merge: bool
               ) -> list[tuple[int, int, int]]:
    """Walk each extent one unit at a time: a gap is a run of units no block covers."""
    covered = {u for a, n in blocks for u in range(a, a + n)}
    order = sorted(range(len(segs)), key=lambda i: segs[i][0])
    ext: list[list[int]] = []
    for i in order:
        a, n, s = segs[i]
        if merge and ext and ext[-1][2] == a and segs[ext[-1][0]][2] == s:
            ext[-1][2] = a + n
        else:
            ext.append([i, a, a + n])
    out = []
    for i, a, b in ext:
        run = None
        for u in range(a, b + 1):
            free = u < b and u not in covered
            if free and run is None:
                run = u
            elif not free and run is not None:
                out.append((i, run * U, (u - run) * U))
                run = None
    return out


@st.composite
def layouts(draw):
    """Segments (start, units, stream) laid out with gaps 0..2 units; blocks tile each with holes."""
    segs, blocks, at = [], [], 1
    for _ in range(draw(st.integers(0, 6))):
        at += draw(st.integers(0, 2))
        n = draw(st.integers(1, 8))
        segs.append((at, n, draw(st.integers(0, 1))))
        u = at
        while u < at + n:
            k = draw(st.integers(1, at + n - u))
            if draw(st.booleans()):
                blocks.append((u, k))
            u += k
        at += n
    perm = draw(st.permutations(range(len(segs))))
    return [segs[i] for i in perm], blocks


@settings(max_examples=200, deadline=None)
@given(layouts(), st.booleans())
def test_gaps_match_a_unit_walk(layout, merge):
    segs, blocks = layout
    u64 = lambda xs: np.array(xs, np.uint64)  # noqa: E731
    state = PoolState(
        block_addr=u64([a * U for a, _ in blocks]), block_size=u64([n * U for _, n in blocks]),
        block_requested=u64([n * U for _, n in blocks]), block_stream=u64([0] * len(blocks)),
        block_site=np.full(len(blocks), -1, np.int32), block_index=np.arange(len(blocks)),
        seg_addr=u64([a * U for a, _, _ in segs]), seg_size=u64([n * U for _, n, _ in segs]),
        seg_stream=u64([s for _, _, s in segs]), sites=(),
    )
    seg, start, length = state.gaps(merge)
    assert seg.dtype == start.dtype == length.dtype == np.int64
    got = list(zip(seg.tolist(), start.tolist(), length.tolist(), strict=True))
    assert got == _reference(segs, blocks, merge)


def test_a_million_live_blocks():
    # One 1 GiB-scale segment holding 10^6 blocks of 512 B with every other slot free.
    n = 1_000_000
    addr = (np.arange(n, dtype=np.uint64) * 2 * U)
    st_ = PoolState(addr, np.full(n, U, np.uint64), np.full(n, U, np.uint64), np.zeros(n, np.uint64),
                    np.full(n, -1, np.int32), np.arange(n), np.zeros(1, np.uint64),
                    np.array([2 * n * U], np.uint64), np.zeros(1, np.uint64), ())
    seg, start, length = st_.gaps()
    assert len(seg) == n and (length == U).all() and start[0] == U
