"""Coordinate compression of addresses: sorted distinct values and each value's rank, compiled.

Traces reuse addresses heavily (a 10-million-event pool trace touches about
1.6 million distinct block boundaries), so an open-addressing hash table
dedupes first and only the distinct values are sorted; no full sort of every
address is needed.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.trace.schema import Op

EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)  # free slot marker of the hash table


@plain
def _shift_for(cap):  # pragma: no cover - compiled
    shift = np.uint64(64)
    while cap > 1:
        cap >>= 1
        shift -= np.uint64(1)
    return shift


@plain
def _probe(tab, key, shift, mask):  # pragma: no cover - compiled
    # Fibonacci hashing with linear probing: the slot holding key, or the empty slot for it.
    j = np.int64((key * np.uint64(0x9E3779B97F4A7C15)) >> shift)
    while True:
        k = tab[j, 0]
        if k == key or k == EMPTY:  # noqa: SIM109 (plain compares compile best)
            return j
        j = (j + 1) & mask


@njit(cache=True)
def compress(values):  # pragma: no cover - compiled
    """Sorted distinct ``values`` (uint64) and each value's index among them.

    An open-addressing hash table of (key, rank) rows, grown as it fills so it
    stays the size of the distinct set, dedupes first; only the distinct
    values are sorted (traces reuse addresses: far fewer distinct values than
    events). Slots remembered in the first pass are reused in the second
    unless the table grew after them.
    """
    n = values.shape[0]
    cap = 1 << 12
    tab = np.full((cap, 2), EMPTY, np.uint64)
    shift = _shift_for(cap)
    distinct = 0
    has_empty = False
    slot_of = np.empty(n, np.int64)
    valid_from = 0
    for i in range(n):
        key = values[i]
        if key == EMPTY:
            has_empty = True
            continue
        j = _probe(tab, key, shift, cap - 1)
        slot_of[i] = j
        if tab[j, 0] == EMPTY:
            tab[j, 0] = key
            distinct += 1
            if 2 * distinct > cap:  # grow and rehash; earlier slots are stale
                old = tab
                cap *= 4
                tab = np.full((cap, 2), EMPTY, np.uint64)
                shift = _shift_for(cap)
                for r in range(old.shape[0]):
                    k = old[r, 0]
                    if k != EMPTY:
                        tab[_probe(tab, k, shift, cap - 1), 0] = k
                valid_from = i + 1
    keys = np.empty(distinct + (1 if has_empty else 0), np.uint64)
    c = 0
    for r in range(cap):
        if tab[r, 0] != EMPTY:
            keys[c] = tab[r, 0]
            c += 1
    if has_empty:
        keys[c] = EMPTY  # the largest uint64 sorts last
    keys[:distinct].sort()
    for r in range(distinct):
        tab[_probe(tab, keys[r], shift, cap - 1), 1] = r
    index = np.empty(n, np.int64)
    for i in range(n):
        key = values[i]
        if key == EMPTY:
            index[i] = distinct
        elif i >= valid_from:
            index[i] = np.int64(tab[slot_of[i], 1])
        else:
            index[i] = np.int64(tab[_probe(tab, key, shift, cap - 1), 1])
    return keys, index


@njit(cache=True)
def opening_ranges(op, addr, size, rounded, mate):  # pragma: no cover - compiled
    """The rows that open an address range and the range bounds, in one pass.

    Opening rows: malloc ``[addr, addr + rounded)``, segment_alloc and unpaired
    free / segment_free ``[addr, addr + size)``. Returns (row indices, bounds)
    where bounds holds all starts, then all ends (uint64).
    """
    n = op.shape[0]
    k = 0
    for i in range(n):
        if _opens(op[i], mate[i]):
            k += 1
    rows = np.empty(k, np.int64)
    bounds = np.empty(2 * k, np.uint64)
    r = 0
    for i in range(n):
        o = op[i]
        if _opens(o, mate[i]):
            rows[r] = i
            bounds[r] = addr[i]
            bounds[k + r] = addr[i] + (rounded[i] if o == Op.MALLOC else size[i])
            r += 1
    return rows, bounds


@plain
def _opens(o, mate):  # pragma: no cover - compiled
    # A malloc or segment_alloc, or a free / segment_free whose opening row the trace lacks.
    if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
        return True
    return (o == Op.FREE or o == Op.SEGMENT_FREE) and mate < 0
