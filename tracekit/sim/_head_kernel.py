"""The compiled loops of ``tracekit.sim.head_start``: the live blocks' table that pairs the frees
of each window as it is read, and the check that what was replayed agrees with the trace as read.
Every loop lets go of the GIL: they run in the head start's thread, beside the reader."""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.sim.codes import Kind
from tracekit.trace.schema import Op

SIZE_CLAMP = 1 << 62  # as ``tracekit.sim.prepare``: larger requests are clamped there, so they stop here
EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)  # a free slot's key: no recorded block starts at 2^64 - 1
GROW = -2  # ``pair``'s answer where the table must grow first
SLOTS = 1 << 12  # a new table's slots


def new_table(slots: int = SLOTS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An empty table of live blocks: keys (addresses), devices, values (the malloc's row)."""
    return np.full(slots, EMPTY, np.uint64), np.zeros(slots, np.int16), np.zeros(slots, np.int64)


def grown(keys: np.ndarray, devs: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The table twice as large, its live blocks inserted again."""
    k2, d2, v2 = new_table(2 * keys.shape[0])
    _rehash(keys, devs, vals, k2, d2, v2)
    return k2, d2, v2


@njit(cache=True, inline="always")
def _home(a, mask):  # pragma: no cover - compiled
    """A key's first slot: the middle bits of a multiplicative hash."""
    return np.int64((a * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(20)) & mask


@njit(cache=True, nogil=True)
def pair(op, addr, device, size, lo, hi, kind, mate, keys, devs, vals, state):  # pragma: no cover
    """Rows lo..hi: ``kind`` (``Kind``) and, for a free, ``mate`` (its malloc, else -1), through
    the open-addressing table of live blocks (``keys``/``devs``/``vals``, linear probing, a freed
    block's slot emptied by shifting its successors back: the table holds the live blocks only).
    ``state``: [live, most live, used slots, the row to go on from after GROW]. Returns the first
    row the head start cannot replay (``tracekit.sim.head_start``; -1: none), or ``GROW`` where the
    table must grow first (``grown``), the rows before ``state[3]`` done."""
    mask = keys.shape[0] - 1
    for i in range(lo, hi):
        o = op[i]
        if o == Op.MALLOC:
            if size[i] >= SIZE_CLAMP:
                return i
            if 2 * (state[2] + 1) > keys.shape[0]:
                state[3] = i
                return GROW
            a = addr[i]
            d = device[i]
            j = _home(a, mask)
            while keys[j] != EMPTY and not (keys[j] == a and devs[j] == d):
                j = (j + 1) & mask
            if keys[j] != EMPTY:
                return i  # a malloc at a live address: the reader drops it
            keys[j] = a
            devs[j] = d
            vals[j] = i
            state[2] += 1
            kind[i] = Kind.ALLOC
            mate[i] = -1
            state[0] += 1
            if state[0] > state[1]:
                state[1] = state[0]
        elif o == Op.FREE:
            a = addr[i]
            d = device[i]
            j = _home(a, mask)
            while keys[j] != EMPTY and not (keys[j] == a and devs[j] == d):
                j = (j + 1) & mask
            if keys[j] == EMPTY:
                return i  # a free of no live block: the reader drops it
            kind[i] = Kind.FREE
            mate[i] = vals[j]
            state[0] -= 1
            state[2] -= 1
            keys[j] = EMPTY  # backward-shift deletion: later slots of the run move up where they may
            k = j
            while True:
                k = (k + 1) & mask
                if keys[k] == EMPTY:
                    break
                home = _home(keys[k], mask)
                if (j <= k and (home <= j or home > k)) or (j > k and home <= j and home > k):
                    keys[j] = keys[k]
                    devs[j] = devs[k]
                    vals[j] = vals[k]
                    keys[k] = EMPTY
                    j = k
        elif o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE:
            kind[i] = Kind.OTHER
            mate[i] = -1
        else:  # an oom row (handled or not: known once the read ends) or an unknown code
            return i
    return -1


@njit(cache=True, nogil=True)
def agrees(kind, size, mate, t_kind, t_size, t_mate, p):  # pragma: no cover - compiled
    """Rows 0..p replay alike from (kind, size, mate) and from the trace's (t_*): the same kinds,
    the same request sizes, the same malloc for every free."""
    for i in range(p):
        k = kind[i]
        if k != t_kind[i]:
            return False
        if k == Kind.ALLOC and size[i] != t_size[i]:
            return False
        if k == Kind.FREE and mate[i] != t_mate[i]:
            return False
    return True


@njit(cache=True, nogil=True)
def _rehash(keys, devs, vals, k2, d2, v2):  # pragma: no cover - compiled
    mask = k2.shape[0] - 1
    for j in range(keys.shape[0]):
        a = keys[j]
        if a == EMPTY:
            continue
        h = _home(a, mask)
        while k2[h] != EMPTY:
            h = (h + 1) & mask
        k2[h] = a
        d2[h] = devs[j]
        v2[h] = vals[j]
