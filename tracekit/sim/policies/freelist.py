"""The address-ordered free list over one contiguous heap, with four placement policies.

The heap is ``[0, capacity)`` (unbounded when no capacity is given: a heap of
2**60 bytes). Requests are rounded up to a multiple of 512 bytes (at least
512). A placement takes a free block of at least the rounded size, keeps its
low part for the request and leaves the rest free; a free coalesces the block
with both address neighbours when they are free, so no two free blocks are
ever adjacent. Placement policies (``Fit``):

- first fit: the lowest-addressed free block that fits;
- best fit: the smallest free block that fits, ties to the lowest address;
- next fit: the first fitting free block at or after the roving pointer
  (the end of the previous placement; the free block containing it counts),
  wrapping around to the heap start;
- worst fit: the largest free block, ties to the lowest address.

A request fails (OOM) only when no free block is large enough. Every block
(free or in use) is a row of one int64 table linked in address order; free
blocks also sit in a treap (``tracekit.sim.treap``) keyed by address (first,
next fit) or by (size, address) (best, worst fit). The policy modules
``freelist_*.py`` each expose one ``MODEL``; this module holds the machinery.
"""

from __future__ import annotations

from enum import IntEnum
from typing import ClassVar

import numpy as np
from numba import njit

from tracekit.errors import UsageError
from tracekit.sim import progress, sizeclass, treap
from tracekit.sim.base import PolicyRun, SimConfig, Stat
from tracekit.sim.prepare import prepare
from tracekit.sim.treap import K1, K2, MX, NFIELDS, SZ
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

UNIT = 512
UNBOUNDED = 1 << 60
SEGMENT_ROUND = 2 << 20  # unbounded heaps are reported as a segment rounded up to 2 MiB

ADDR, PREV, NEXT, ISFREE = NFIELDS, NFIELDS + 1, NFIELDS + 2, NFIELDS + 3
WIDTH = NFIELDS + 4
# Slots of the kernel's scalar state.
ROOT, RECYCLE, NEXT_ID, ROVER, LIVE, CAP, FIT, STOPPED = range(8)


# Stat slots as plain ints: compiled code reads them as constants.
S_PEAK_LIVE, S_PEAK_EXTENT, S_OOMS, S_FIRST_OOM = (
    int(Stat.PEAK_LIVE), int(Stat.PEAK_EXTENT), int(Stat.OOMS), int(Stat.FIRST_OOM))
S_OOM_FREE, S_OOM_LARGEST, S_OOM_LIVE, S_OOM_RESERVED, S_OOM_ROUNDED = (
    int(Stat.OOM_FREE), int(Stat.OOM_LARGEST), int(Stat.OOM_LIVE), int(Stat.OOM_RESERVED),
    int(Stat.OOM_ROUNDED))


class Fit(IntEnum):
    FIRST = 0
    BEST = 1
    NEXT = 2
    WORST = 3


def round_request(size: np.ndarray) -> np.ndarray:
    """Requested bytes -> block bytes: up to a multiple of 512, at least 512."""
    return np.maximum((size + (UNIT - 1)) // UNIT * UNIT, UNIT)


@njit(cache=True, inline="always")
def _key(T, x, by_size):  # pragma: no cover - compiled
    if by_size:
        T[x, K1] = T[x, SZ]
        T[x, K2] = T[x, ADDR]
    else:
        T[x, K1] = T[x, ADDR]
        T[x, K2] = 0


@njit(cache=True)
def _find(T, st, stack, roots, bm, r):  # pragma: no cover - compiled
    fit = st[FIT]
    root = st[ROOT]
    if fit == 0:
        return treap.first_fit(T, root, r)
    if fit == 1:
        return sizeclass.best(T, roots, bm, r)
    if fit == 3:
        top = treap.rightmost(T, root)
        if top < 0 or T[top, SZ] < r:
            return -1
        return treap.lower_bound(T, root, T[top, SZ], 0)
    # next fit: start at the free block containing the rover, else the next one up
    start = st[ROVER]
    y = treap.floor(T, root, start, 0)
    if y >= 0 and T[y, ADDR] + T[y, SZ] > start:
        start = T[y, ADDR]
    x = treap.first_fit_from(T, root, start, r, stack)
    if x < 0:
        x = treap.first_fit(T, root, r)
    return x


@njit(cache=True)
def _new_node(T, st):  # pragma: no cover - compiled
    x = st[RECYCLE]
    if x >= 0:
        st[RECYCLE] = T[x, NEXT]
        return x
    x = st[NEXT_ID]
    st[NEXT_ID] = x + 1
    return x


@njit(cache=True)
def _drop_node(T, st, x):  # pragma: no cover - compiled
    T[x, NEXT] = st[RECYCLE]
    st[RECYCLE] = x


@njit(cache=True)
def _sized_add(T, st, roots, bm, x):  # pragma: no cover - compiled
    """Insert free block x into the by-size index (best fit: size classes; worst fit: one tree)."""
    _key(T, x, True)
    if st[FIT] == 1:
        sizeclass.add(T, roots, bm, x)
    else:
        st[ROOT] = treap.insert(T, st[ROOT], x, False)


@njit(cache=True)
def _sized_drop(T, st, roots, bm, x):  # pragma: no cover - compiled
    if st[FIT] == 1:
        sizeclass.drop(T, roots, bm, x)
    else:
        st[ROOT] = treap.remove(T, st[ROOT], x, False)


@njit(cache=True)
def _place(T, st, roots, bm, x, r):  # pragma: no cover - compiled
    """Take the low r bytes of free block x; return the node of the new used block."""
    by_size = st[FIT] == 1 or st[FIT] == 3
    a = T[x, ADDR]
    rest = T[x, SZ] - r
    if rest == 0:
        if by_size:
            _sized_drop(T, st, roots, bm, x)
        else:
            st[ROOT] = treap.remove(T, st[ROOT], x, True)
        T[x, ISFREE] = 0
        return x
    y = _new_node(T, st)
    T[y, ADDR] = a
    T[y, SZ] = r
    T[y, ISFREE] = 0
    p = T[x, PREV]
    T[y, PREV] = p
    T[y, NEXT] = x
    T[x, PREV] = y
    if p >= 0:
        T[p, NEXT] = y
    if by_size:
        _sized_drop(T, st, roots, bm, x)
        T[x, ADDR] = a + r
        T[x, SZ] = rest
        _sized_add(T, st, roots, bm, x)
    else:  # keyed by address: the rest keeps x's place in the order
        T[x, ADDR] = a + r
        treap.rekey(T, x, a + r, rest)
    return y


@njit(cache=True)
def _unlink(T, st, x):  # pragma: no cover - compiled
    """Remove node x from the address list and recycle it."""
    p = T[x, PREV]
    n = T[x, NEXT]
    if p >= 0:
        T[p, NEXT] = n
    if n >= 0:
        T[n, PREV] = p
    _drop_node(T, st, x)


@njit(cache=True)
def _release(T, st, roots, bm, x):  # pragma: no cover - compiled
    """Free used block x, coalescing with free address neighbours."""
    p = T[x, PREV]
    n = T[x, NEXT]
    pf = p >= 0 and T[p, ISFREE] == 1
    nf = n >= 0 and T[n, ISFREE] == 1
    if st[FIT] == 1 or st[FIT] == 3:  # keyed by size: merged blocks move in the order
        if pf:
            _sized_drop(T, st, roots, bm, p)
            T[x, ADDR] = T[p, ADDR]
            T[x, SZ] += T[p, SZ]
            _unlink(T, st, p)
        if nf:
            _sized_drop(T, st, roots, bm, n)
            T[x, SZ] += T[n, SZ]
            _unlink(T, st, n)
        T[x, ISFREE] = 1
        _sized_add(T, st, roots, bm, x)
        return
    # Keyed by address: a merged block keeps the place of its lowest free part.
    if pf:
        grown = T[p, SZ] + T[x, SZ]
        if nf:
            grown += T[n, SZ]
            st[ROOT] = treap.remove(T, st[ROOT], n, True)
            _unlink(T, st, n)
        _unlink(T, st, x)
        treap.rekey(T, p, T[p, ADDR], grown)
    elif nf:
        a = T[x, ADDR]
        grown = T[n, SZ] + T[x, SZ]
        _unlink(T, st, x)
        T[n, ADDR] = a
        treap.rekey(T, n, a, grown)
    else:
        T[x, ISFREE] = 1
        _key(T, x, False)
        st[ROOT] = treap.insert(T, st[ROOT], x, True)


@njit(cache=True)
def _largest(T, st, roots, bm):  # pragma: no cover - compiled
    if st[FIT] == 1:
        return sizeclass.largest(T, roots, bm)
    root = st[ROOT]
    if root < 0:
        return 0
    if st[FIT] == 3:  # keyed by size: the last node
        return T[treap.rightmost(T, root), SZ]
    return T[root, MX]


@njit(cache=True)
def run_chunk(T, st, stack, roots, bm, kind, rounded, mate, node_of, addr_out, status, stats, lo, hi,
              cont):
    # pragma: no cover - compiled
    for i in range(lo, hi):
        k = kind[i]
        if k == 0:
            r = rounded[i]
            x = _find(T, st, stack, roots, bm, r)
            if x < 0:
                status[i] = 2  # Status.OOM
                stats[S_OOMS] += 1
                if stats[S_FIRST_OOM] < 0:
                    stats[S_FIRST_OOM] = i
                    stats[S_OOM_FREE] = st[CAP] - st[LIVE]
                    stats[S_OOM_LARGEST] = _largest(T, st, roots, bm)
                    stats[S_OOM_LIVE] = st[LIVE]
                    stats[S_OOM_RESERVED] = st[CAP]
                    stats[S_OOM_ROUNDED] = r
                if not cont:
                    st[STOPPED] = 1
                    return
                continue
            y = _place(T, st, roots, bm, x, r)
            a = T[y, ADDR]
            node_of[i] = y
            addr_out[i] = a
            status[i] = 1  # Status.DONE
            st[ROVER] = a + r
            st[LIVE] += r
            if st[LIVE] > stats[S_PEAK_LIVE]:
                stats[S_PEAK_LIVE] = st[LIVE]
            if a + r > stats[S_PEAK_EXTENT]:
                stats[S_PEAK_EXTENT] = a + r
        elif k == 1:
            m = mate[i]
            if m < 0:
                continue
            if status[m] != 1:
                status[i] = 3  # Status.SKIPPED: its malloc failed
                continue
            y = node_of[m]
            st[LIVE] -= T[y, SZ]
            _release(T, st, roots, bm, y)
            status[i] = 1


@njit(cache=True)
def _seed(T, st, roots, bm, cap):  # pragma: no cover - compiled
    """Node 0: the whole heap [0, cap), free (no node for an empty heap)."""
    st[ROOT] = -1
    if cap <= 0:
        return
    T[0, SZ] = cap
    T[0, ADDR] = 0
    T[0, PREV] = -1
    T[0, NEXT] = -1
    T[0, ISFREE] = 1
    if st[FIT] == 1 or st[FIT] == 3:
        _sized_add(T, st, roots, bm, 0)
    else:
        _key(T, 0, False)
        st[ROOT] = treap.insert(T, -1, 0, True)


class FreeListModel:
    """Shared ``run`` of the four free-list policies; subclasses set name and fit."""

    name: ClassVar[str]
    description: ClassVar[str]
    fit: ClassVar[Fit]

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        if config.options:
            raise UsageError(f"policy {self.name} takes no options (got {', '.join(config.options)})")
        inp = prepare(trace)
        n = len(inp)
        cap = UNBOUNDED if config.capacity is None else int(config.capacity)
        rounded = round_request(inp.size)
        rows = 2 * inp.max_live + 2  # no two free blocks are adjacent
        T = np.zeros((rows, WIDTH), np.int64)
        st = np.array([0, -1, 1, 0, 0, cap, int(self.fit), 0], np.int64)
        stats = np.zeros(len(Stat), np.int64)
        stats[Stat.FIRST_OOM] = -1
        stats[Stat.PEAK_EXTENT] = 0
        if self.fit == Fit.BEST:
            roots, bm = sizeclass.new_tables()
        else:
            roots, bm = np.full(1, -1, np.int64), np.zeros(1, np.int64)
        _seed(T, st, roots, bm, cap)
        stack = np.empty(4096, np.int64)
        node_of = np.empty(n, np.int32)
        addr = np.zeros(n, np.uint64)
        status = np.zeros(n, np.int8)
        for lo, hi in progress.chunks(n):
            run_chunk(T, st, stack, roots, bm, inp.kind, rounded, inp.mate, node_of, addr, status,
                      stats, lo, hi, config.continue_on_oom)
            if st[STOPPED]:
                break
        return heap_run(config, addr, status, rounded, stats)


def heap_run(config: SimConfig, addr: np.ndarray, status: np.ndarray, rounded: np.ndarray,
             stats: np.ndarray) -> PolicyRun:
    """The ``PolicyRun`` of a single-heap policy: one ``segment_alloc`` row for the heap,
    ``[0, capacity)``, or ``[0, peak extent rounded up to 2 MiB)`` when unbounded."""
    stats[Stat.PEAK_RESERVED] = stats[Stat.PEAK_EXTENT]
    stats[Stat.SEGMENT_ALLOCS] = 1
    stats[Stat.SEGMENT_FREES] = 0
    if config.capacity is None:
        ext = int(stats[Stat.PEAK_EXTENT])
        heap = max(SEGMENT_ROUND, -(-ext // SEGMENT_ROUND) * SEGMENT_ROUND)
    else:
        heap = int(config.capacity)
    return PolicyRun(
        addr=addr,
        status=status,
        rows_before=np.zeros(1, np.int64),
        rows_op=np.array([Op.SEGMENT_ALLOC], np.int8),
        rows_addr=np.zeros(1, np.uint64),
        rows_size=np.array([heap], np.uint64),
        rows_stream=np.zeros(1, np.uint64),
        stats=stats,
        rounded=rounded.view(np.uint64),
    )
