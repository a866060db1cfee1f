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

from tracekit.compiled import plain
from tracekit.sim import chunks as ck
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Piece as P
from tracekit.sim.codes import Slot, Tree


@plain(error_model="numpy")
def _less(C, x, y, t):  # pragma: no cover - compiled
    """Piece x before piece y in tree t's order, from the pieces' own fields."""
    gx = C[x, F.GROUP]
    gy = C[y, F.GROUP]
    if gx != gy:
        return gx < gy
    if t == Tree.FREE:
        sx = C[x, F.SIZE]
        sy = C[y, F.SIZE]
        if sx != sy:
            return sx < sy
    return C[x, F.ADDR] < C[y, F.ADDR]


@plain(error_model="numpy")
def _tree_count(C, S, t):  # pragma: no cover - compiled
    x = ck.tree_first(C, S, t)
    k = 0
    ordered = True
    prev = -1
    while x != -1:
        if prev != -1 and not _less(C, prev, x, t):
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
    for h in range(S[Slot.HW]):
        st = C[h, F.STATE]
        if st == P.DEAD:
            continue
        if st == P.FREE:
            n_free += 1
            if C[h, F.PREV] == -1 and C[h, F.NEXT] == -1 and C[h, F.EXP] == -1:
                n_whole += 1
        elif st == P.UNMAPPED:
            n_unmapped += 1
        else:
            live += C[h, F.SIZE]
        if C[h, F.PREV] != -1:
            continue
        x = h
        end = C[h, F.ADDR]
        while x != -1:
            if C[x, F.ADDR] != end:
                return 1
            if C[x, F.GROUP] != C[h, F.GROUP]:
                return 3
            nx = C[x, F.NEXT]
            if nx != -1 and C[x, F.STATE] == P.FREE and C[nx, F.STATE] == P.FREE:
                return 2
            if C[x, F.STATE] != P.UNMAPPED:
                mapped += C[x, F.SIZE]
            end += C[x, F.SIZE]
            x = nx
        if C[h, F.EXP] == -1 and end != C[h, F.SEGEND]:
            return 1
        starts.append(C[h, F.ADDR])
        ends.append(end)
    if mapped != S[Slot.RESERVED]:
        return 4
    if live != S[Slot.LIVE]:
        return 5
    k, ordered = _tree_count(C, S, Tree.FREE)
    if not ordered or k != n_free:
        return 6
    k, ordered = _tree_count(C, S, Tree.UNMAPPED)
    if not ordered or k != n_unmapped:
        return 7
    w = 0
    x = S[Slot.WHEAD]
    while x != -1:
        if C[x, F.STATE] != P.FREE or C[x, F.PREV] != -1 or C[x, F.NEXT] != -1:
            return 8
        w += 1
        x = C[x, F.WNEXT]
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
