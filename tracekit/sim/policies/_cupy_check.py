"""Consistency check of a pool model's chunk store (used by the property tests).

``check_state`` walks every device allocation and both trees and returns 0
when the store is sound, else the number of the first broken rule: (1) the
pieces of an allocation are not contiguous or leave the allocation, (2) two
free pieces are adjacent (a missed merge), (3) pieces of one allocation are in
different groups, (4) reserved bytes != mapped allocation bytes, (5) live bytes
!= used pieces, (6) the free tree is out of order or misses a free piece,
(7) the unmapped tree misses an unmapped piece, (8) the whole-allocation list
is wrong, (9) two device allocations overlap.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.sim.policies import _cupy_chunks as ck


@njit(cache=True, error_model="numpy")
def _tree_count(C, S, t):  # pragma: no cover - compiled
    x = S[ck.ROOT0 + t]
    if x == -1:
        return 0, True
    while ck.pred(C, x, t) != -1:
        x = ck.pred(C, x, t)
    k = 0
    ordered = True
    prev = -1
    while x != -1:
        if prev != -1 and not ck._less(C, prev, x, t):
            ordered = False
        k += 1
        prev = x
        x = ck.succ(C, x, t)
    return k, ordered


@njit(cache=True, error_model="numpy")
def check_state(C, S):  # pragma: no cover - compiled
    n_free = n_unmapped = n_whole = live = mapped = 0
    starts = []
    ends = []
    for h in range(S[ck.HW]):
        st = C[h, ck.STATE]
        if st == ck.DEAD:
            continue
        if st == ck.FREE:
            n_free += 1
            if C[h, ck.PREV] == -1 and C[h, ck.NEXT] == -1 and C[h, ck.EXP] == -1:
                n_whole += 1
        elif st == ck.UNMAPPED:
            n_unmapped += 1
        else:
            live += C[h, ck.SIZE]
        if C[h, ck.PREV] != -1:
            continue
        x = h
        end = C[h, ck.ADDR]
        while x != -1:
            if C[x, ck.ADDR] != end:
                return 1
            if C[x, ck.GROUP] != C[h, ck.GROUP]:
                return 3
            nx = C[x, ck.NEXT]
            if nx != -1 and C[x, ck.STATE] == ck.FREE and C[nx, ck.STATE] == ck.FREE:
                return 2
            if C[x, ck.STATE] != ck.UNMAPPED:
                mapped += C[x, ck.SIZE]
            end += C[x, ck.SIZE]
            x = nx
        if C[h, ck.EXP] == -1 and end != C[h, ck.SEGEND]:
            return 1
        starts.append(C[h, ck.ADDR])
        ends.append(end)
    if mapped != S[ck.RESERVED]:
        return 4
    if live != S[ck.LIVE]:
        return 5
    k, ordered = _tree_count(C, S, 0)
    if not ordered or k != n_free:
        return 6
    k, ordered = _tree_count(C, S, 1)
    if not ordered or k != n_unmapped:
        return 7
    w = 0
    x = S[ck.WHEAD]
    while x != -1:
        if C[x, ck.STATE] != ck.FREE or C[x, ck.PREV] != -1 or C[x, ck.NEXT] != -1:
            return 8
        w += 1
        x = C[x, ck.WNEXT]
    if w != n_whole:
        return 8
    if len(starts) > 1:
        a = np.array(starts)
        b = np.array(ends)
        order = np.argsort(a)
        for j in range(1, len(order)):
            if a[order[j]] < b[order[j - 1]]:
                return 9
    return 0
