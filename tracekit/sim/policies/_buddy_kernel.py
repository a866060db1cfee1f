"""The buddy allocator's compiled loop (``buddy``): the free blocks of each order in a treap.

Addresses and sizes are bytes (int64); a block of order k is ``2**k`` bytes. ``T`` is the node table
(one row per free block, the treap's columns from ``AT``), ``st`` the scalar state indexed by
``BuddySlot``, ``roots`` the root of each order's treap (-1: none free).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import treap
from tracekit.sim.codes import BUDDY_MAX_ORDER as MAX_ORDER
from tracekit.sim.codes import BuddySlot as B
from tracekit.sim.codes import Kind, Stat, Status
from tracekit.sim.heap import UNIT
from tracekit.sim.prepare import stand_in
from tracekit.sim.treap import K1, K2, K3, SZ

AT = 0  # the treap's columns start the row
SPARE = 2 * MAX_ORDER  # free rows kept available before each event (one split makes <= 53)


@plain
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


@plain
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


@plain
def _largest_order(roots):  # pragma: no cover - compiled
    for j in range(MAX_ORDER, -1, -1):
        if roots[j] >= 0:
            return j
    return -1


@njit(cache=True, nogil=True)  # nogil: advise replays settings in threads (workers.Pool)
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


@plain
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


@plain
def seed_heap(T, st, roots, cap):  # pragma: no cover - compiled
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
