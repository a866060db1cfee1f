"""``buddy``: a binary buddy allocator over one heap, for contrast with the free lists.

A request is rounded up to a power of two, at least 512 bytes (so internal
waste stays below half the block). The heap ``[0, capacity)`` (capacity
rounded down to 512 bytes; unbounded: 2**60 bytes) is cut into the largest
aligned power-of-two blocks that fit, lowest address first. A request of
order k (block 2**k bytes) takes the lowest-addressed free block of the
smallest order j >= k that has one and halves it down to order k, keeping
the low half each time and freeing the high halves. A freed block merges
with its buddy (the block at ``addr XOR 2**k``) while the buddy is free at the
same order. A request fails only when no free block of order >= k exists.
The free blocks of each order sit in their own address-keyed treap.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from numba import njit

from tracekit import progress
from tracekit.errors import UsageError
from tracekit.sim import treap
from tracekit.sim.base import Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import BuddySlot as B
from tracekit.sim.codes import Kind, Stat, Status, named_vector
from tracekit.sim.heap import UNBOUNDED, UNIT, heap_run, heap_stats
from tracekit.sim.prepare import attempt_kinds, holders, prepare, stand_in
from tracekit.sim.treap import K1, K2, K3, NFIELDS, SZ
from tracekit.trace.reader import Trace

MIN_ORDER = 9  # 512 bytes
MAX_ORDER = 62
AT = 0  # the treap's columns start the row
SPARE = 2 * MAX_ORDER  # free rows kept available before each event (one split makes <= 53)


def block_order(size: np.ndarray) -> np.ndarray:
    """Requested bytes -> the order k of the smallest block 2**k >= size (k >= 9)."""
    s = np.maximum(size.astype(np.int64), 1)
    k = np.ceil(np.log2(s.astype(np.float64))).astype(np.int64)
    k = np.clip(k, 0, MAX_ORDER)
    # float log2 can be off by one near large powers of two: correct exactly.
    k = np.where((np.int64(1) << k) < s, k + 1, k)
    k = np.where((k > 0) & ((np.int64(1) << np.maximum(k - 1, 0)) >= s), k - 1, k)
    return np.maximum(k, MIN_ORDER)


@njit(cache=True)
def _new(T, st, a, k):  # pragma: no cover - compiled
    x = st[B.RECYCLE]
    if x >= 0:
        st[B.RECYCLE] = T[x, K2]
    else:
        x = st[B.NEXT_ID]
        st[B.NEXT_ID] = x + 1
    T[x, K1] = a
    T[x, K2] = 0
    T[x, K3] = 0
    T[x, SZ] = np.int64(1) << k
    return x


@njit(cache=True)
def _drop(T, st, x):  # pragma: no cover - compiled
    T[x, K2] = st[B.RECYCLE]
    st[B.RECYCLE] = x


@njit(cache=True)
def _grow(T, st):  # pragma: no cover - compiled
    if st[B.NEXT_ID] + SPARE <= T.shape[0]:
        return T
    U = np.zeros((2 * T.shape[0] + SPARE, T.shape[1]), np.int64)
    U[: T.shape[0]] = T
    return U


@njit(cache=True)
def _largest_order(roots):  # pragma: no cover - compiled
    for j in range(MAX_ORDER, -1, -1):
        if roots[j] >= 0:
            return j
    return -1


@njit(cache=True)
def run_chunk(T, st, roots, kind, order, mate, rep, holder, addr_out, status, stats, lo, hi, cont):
    # pragma: no cover - compiled
    for i in range(lo, hi):
        T = _grow(T, st)
        kd = kind[i]
        h = stand_in(kind, rep, holder, i)
        if h >= 0:  # a served handled attempt stands in for this malloc: its block
            addr_out[i] = addr_out[h]
            order[i] = order[h]
        if h != -1:
            status[i] = Status.DONE if h >= 0 else Status.TRIED
            continue
        if kd == Kind.ALLOC or kd == Kind.TRY:
            k = order[i]
            j = k
            while j <= MAX_ORDER and roots[j] < 0:
                j += 1
            if j > MAX_ORDER and kd == Kind.TRY:  # the program survived this failure: it goes on
                status[i] = Status.OOM
                stats[Stat.HANDLED] += 1
                continue
            if j > MAX_ORDER:
                status[i] = Status.OOM
                stats[Stat.OOMS] += 1
                if stats[Stat.FIRST_OOM] < 0:
                    top = _largest_order(roots)
                    stats[Stat.FIRST_OOM] = i
                    stats[Stat.OOM_FREE] = st[B.CAP] - st[B.LIVE]
                    stats[Stat.OOM_LARGEST] = (np.int64(1) << top) if top >= 0 else 0
                    stats[Stat.OOM_LIVE] = st[B.LIVE]
                    stats[Stat.OOM_RESERVED] = st[B.CAP]
                    stats[Stat.OOM_ROUNDED] = np.int64(1) << k
                if not cont:
                    st[B.STOPPED] = 1
                    return T
                continue
            x = treap.leftmost(T, roots[j], AT)
            a = T[x, K1]
            roots[j] = treap.remove(T, roots[j], x, False, AT)
            _drop(T, st, x)
            while j > k:  # halve, keeping the low half
                j -= 1
                y = _new(T, st, a + (np.int64(1) << j), j)
                roots[j] = treap.insert(T, roots[j], y, False, AT)
            size = np.int64(1) << k
            if a + size > stats[Stat.PEAK_EXTENT]:
                stats[Stat.PEAK_EXTENT] = a + size
            if kd == Kind.TRY and rep[i] < 0:  # served; nothing replaced it: released at once
                _merge_free(T, st, roots, a, k)
                status[i] = Status.TRIED
                continue
            addr_out[i] = a
            status[i] = Status.DONE
            if kd == Kind.TRY:  # served: it lives in place of the retry that replaced it
                status[i] = Status.TRIED
                holder[rep[i]] = i
            st[B.LIVE] += size
            if st[B.LIVE] > stats[Stat.PEAK_LIVE]:
                stats[Stat.PEAK_LIVE] = st[B.LIVE]
        elif kd == Kind.FREE:
            m = mate[i]
            if m < 0:
                continue
            if status[m] != Status.DONE:
                status[i] = Status.SKIPPED  # its malloc failed
                continue
            st[B.LIVE] -= np.int64(1) << order[m]
            _merge_free(T, st, roots, np.int64(addr_out[m]), order[m])
            status[i] = Status.DONE
    return T


@njit(cache=True)
def _merge_free(T, st, roots, a, k):  # pragma: no cover - compiled
    """Return the block of order k at a, merged with its free buddies."""
    while k < MAX_ORDER:
        b = a ^ (np.int64(1) << k)
        y = treap.find(T, roots[k], b, 0, 0, AT)
        if y < 0:
            break
        roots[k] = treap.remove(T, roots[k], y, False, AT)
        _drop(T, st, y)
        a = min(a, b)
        k += 1
    y = _new(T, st, a, k)
    roots[k] = treap.insert(T, roots[k], y, False, AT)


@njit(cache=True)
def _seed_heap(T, st, roots, cap):  # pragma: no cover - compiled
    """Cut [0, cap) into the largest aligned power-of-two blocks, lowest address first."""
    a = np.int64(0)
    rest = cap
    while rest >= UNIT:
        k = MAX_ORDER
        while (np.int64(1) << k) > rest:
            k -= 1
        y = _new(T, st, a, k)
        roots[k] = treap.insert(T, roots[k], y, False, AT)
        a += np.int64(1) << k
        rest -= np.int64(1) << k


class Buddy:
    name: ClassVar[str] = "buddy"
    description: ClassVar[str] = "Binary buddy: power-of-two blocks, split in halves, merge with the buddy"
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.HEAP, rank=4)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        if config.options:
            raise UsageError(f"policy buddy takes no options (got {', '.join(config.options)})")
        inp = prepare(trace)
        n = len(inp)
        cap = UNBOUNDED if config.capacity is None else int(config.capacity) // UNIT * UNIT
        order = block_order(inp.size)
        T = np.zeros((1024, NFIELDS), np.int64)
        st = named_vector(B, {B.RECYCLE: -1, B.NEXT_ID: 0, B.LIVE: 0, B.CAP: cap, B.STOPPED: 0})
        roots = np.full(MAX_ORDER + 1, -1, np.int64)
        _seed_heap(T, st, roots, cap)
        stats = heap_stats()
        addr = np.zeros(n, np.uint64)
        status = np.zeros(n, np.int8)
        kind = attempt_kinds(inp, config.stop_at_first_oom)
        holder = holders(n)
        for lo, hi in progress.chunks(n):
            T = run_chunk(T, st, roots, kind, order, inp.mate, inp.replaced_by, holder, addr, status, stats,
                          lo, hi, config.continue_on_oom)
            if st[B.STOPPED]:
                break
        rounded = np.left_shift(np.int64(1), order)
        return heap_run(config, addr, status, rounded, stats)


MODEL = Buddy()
