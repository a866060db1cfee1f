"""Expandable segments of PyTorch's caching allocator (``expandable_segments:True``).

One segment per group (pool, stream) reserves a large virtual range (PyTorch:
1 1/8 x device memory) that starts unmapped (tree 1 of the chunk store).
``try_allocate`` follows ``try_allocate_expandable_block``: take the lowest
unmapped range of the group whose run of free-or-unmapped pieces (starting at
its free predecessor, if any) holds s bytes, then map pages (2 MiB in the small
pool, 20 MiB in the large) until the free piece there holds s. Mapped pages
count as reserved and are emitted as one ``segment_alloc`` row per page.
``unmap_all_free`` (``release_cached_blocks``) unmaps the whole pages inside
every free mapped piece, one ``segment_free`` row per page, so the rows of an
output trace pair by address as v1 requires. ``X[g]`` holds the
segment's base address, page size, a created flag and its size (PyTorch:
pages for 9/8 of the device's memory).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import chunks as ck
from tracekit.sim import segments as sg
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Op, Reserve, Slot, Tree
from tracekit.sim.codes import Piece as P
from tracekit.sim.codes import Reservation as X_


@plain(error_model="numpy")
def expandable_size(C, b):  # pragma: no cover - compiled
    """A free piece's size for best fit: plus the unmapped range right after it."""
    nx = C[b, F.NEXT]
    extra = C[nx, F.SIZE] if nx != -1 and C[nx, F.STATE] == P.UNMAPPED else 0
    return C[b, F.SIZE] + extra


@plain(error_model="numpy")
def _ensure(C, S, g, X, i, hints):  # pragma: no cover - compiled
    """Reserve group g's segment on first use, at the recorded address when there is one."""
    if X[g, X_.MADE] != Reserve.NONE:
        return
    pg = X[g, X_.PAGE]
    base = sg.recorded_addr(C, S, X, i, X[g, X_.VSIZE], hints, False)
    if base < 0:
        base = (S[Slot.NEXT_ADDR] + pg - 1) // pg * pg
        S[Slot.NEXT_ADDR] = base + X[g, X_.VSIZE] + pg
    x = ck.new_node(C, S, base, X[g, X_.VSIZE], g, P.UNMAPPED)
    C[x, F.EXP] = g
    ck.tree_insert(C, S, x, Tree.UNMAPPED)
    X[g, X_.BASE] = base
    X[g, X_.MADE] = Reserve.DONE


@plain(error_model="numpy")
def _emit_pages(R, S, i, op, a, size, pg, stream):  # pragma: no cover - compiled
    """One row per page, so every segment_free pairs with a segment_alloc of its address."""
    for p in range(a, a + size, pg):
        ck.emit(R, S, i, op, p, pg, stream)


@plain(error_model="numpy")
def map_initial(C, S, R, i, g, a, size, stream, X):  # pragma: no cover - compiled
    """Starting state: [a, a + size) of group g's segment is mapped (a recorded mapped range).

    The segment is reserved at ``X[g, X_.BASE]`` (the lowest recorded mapped
    address of the group, set by the caller with ``X[g, X_.MADE] = Reserve.AT_BASE``). The range
    becomes a free mapped piece, merged with mapped neighbours; -1 if it does
    not lie in unmapped space of that segment.
    """
    if X[g, X_.MADE] == Reserve.AT_BASE:
        x = ck.new_node(C, S, X[g, X_.BASE], X[g, X_.VSIZE], g, P.UNMAPPED)
        C[x, F.EXP] = g
        ck.tree_insert(C, S, x, Tree.UNMAPPED)
        X[g, X_.MADE] = Reserve.DONE
    c = ck.first_in_group(C, S, g, Tree.UNMAPPED)
    while c != -1 and C[c, F.GROUP] == g:
        if C[c, F.ADDR] <= a and a + size <= C[c, F.ADDR] + C[c, F.SIZE]:
            break
        c = ck.succ(C, c, Tree.UNMAPPED)
    if c == -1 or C[c, F.GROUP] != g:
        return -1
    ck.tree_remove(C, S, c, Tree.UNMAPPED)
    ca = C[c, F.ADDR]
    if a > ca:
        f = ck.new_node(C, S, ca, a - ca, g, P.UNMAPPED)
        C[f, F.EXP] = g
        ck.link_before(C, c, f)
        ck.tree_insert(C, S, f, Tree.UNMAPPED)
        C[c, F.ADDR] = a
        C[c, F.SIZE] -= a - ca
    return _map_front(C, S, R, i, c, size, X[g, X_.PAGE], stream[g])


@plain(error_model="numpy")
def _map_front(C, S, R, i, x, size, page, st):  # pragma: no cover - compiled
    """Map the first ``size`` bytes of unmapped piece x (already out of the trees).

    The rest of x stays an unmapped piece; the mapped bytes count as reserved
    and device-used, are emitted as ``segment_alloc`` rows of ``page`` bytes,
    and become a free piece merged with its free neighbours (returned).
    """
    g = C[x, F.GROUP]
    a = C[x, F.ADDR]
    if C[x, F.SIZE] > size:
        r = ck.new_node(C, S, a + size, C[x, F.SIZE] - size, g, P.UNMAPPED)
        C[r, F.EXP] = g
        ck.link_after(C, x, r)
        C[x, F.SIZE] = size
        ck.tree_insert(C, S, r, Tree.UNMAPPED)
    S[Slot.RESERVED] += size
    S[Slot.DEV_USED] += size
    if S[Slot.RESERVED] > S[Slot.PEAK_RES]:
        S[Slot.PEAK_RES] = S[Slot.RESERVED]
    _emit_pages(R, S, i, Op.SEGMENT_ALLOC, a, size, page, st)
    C[x, F.STATE] = P.USED
    return ck.free_merge(C, S, x)


@plain(error_model="numpy")
def _find(C, S, g, s, X, i, hints):  # pragma: no cover - compiled
    _ensure(C, S, g, X, i, hints)
    c = ck.first_in_group(C, S, g, Tree.UNMAPPED)
    while c != -1 and C[c, F.GROUP] == g:
        cand = c
        p = C[c, F.PREV]
        if p != -1 and C[p, F.STATE] == P.FREE:
            cand = p
        b = cand
        tot = 0
        while tot < s and b != -1 and (C[b, F.STATE] == P.FREE or C[b, F.STATE] == P.UNMAPPED):
            tot += C[b, F.SIZE]
            b = C[b, F.NEXT]
        if tot >= s:
            return cand
        c = ck.succ(C, c, Tree.UNMAPPED)
    return -1


@plain(error_model="numpy")
def _map(C, S, R, i, x, sz, dev_total, stream, X):  # pragma: no cover - compiled
    """Map the pages covering the first sz bytes of unmapped piece x; -1 if the device is full."""
    g = C[x, F.GROUP]
    base = X[g, X_.BASE]
    pg = X[g, X_.PAGE]
    a = C[x, F.ADDR]
    mapped = min(base + (a + sz - base + pg - 1) // pg * pg - a, C[x, F.SIZE])
    if dev_total > 0 and S[Slot.DEV_USED] + mapped > dev_total:
        return -1
    ck.tree_remove(C, S, x, Tree.UNMAPPED)
    return _map_front(C, S, R, i, x, mapped, pg, stream[g])


@plain(error_model="numpy")
def try_allocate(C, S, R, i, g, s, dev_total, stream, X, hints):  # pragma: no cover - compiled
    """A free mapped piece of group g holding s bytes, out of every tree; -1 on failure."""
    c = _find(C, S, g, s, X, i, hints)
    if c == -1:
        return -1
    if C[c, F.STATE] == P.UNMAPPED:
        c = _map(C, S, R, i, c, min(C[c, F.SIZE], s), dev_total, stream, X)
        if c == -1:
            return -1
    while C[c, F.SIZE] < s:
        nx = C[c, F.NEXT]
        if nx == -1 or C[nx, F.STATE] != P.UNMAPPED:
            return -1
        c = _map(C, S, R, i, nx, min(s - C[c, F.SIZE], C[nx, F.SIZE]), dev_total, stream, X)
        if c == -1:
            return -1
    ck.remove_free(C, S, c)
    return c


@plain(error_model="numpy")
def _unmap(C, S, R, i, b, stream, X):  # pragma: no cover - compiled
    g = C[b, F.GROUP]
    base = X[g, X_.BASE]
    pg = X[g, X_.PAGE]
    a = C[b, F.ADDR]
    sz = C[b, F.SIZE]
    begin = base + (a - base + pg - 1) // pg * pg
    end = base + (a + sz - base) // pg * pg
    if begin >= end:
        return
    ck.remove_free(C, S, b)
    if begin > a:
        f = ck.new_node(C, S, a, begin - a, g, P.FREE)
        C[f, F.EXP] = g
        ck.link_before(C, b, f)
        ck.insert_free(C, S, f)
    if a + sz > end:
        h = ck.new_node(C, S, end, a + sz - end, g, P.FREE)
        C[h, F.EXP] = g
        ck.link_after(C, b, h)
        ck.insert_free(C, S, h)
    C[b, F.ADDR] = begin
    C[b, F.SIZE] = end - begin
    C[b, F.STATE] = P.UNMAPPED
    p = C[b, F.PREV]
    if p != -1 and C[p, F.STATE] == P.UNMAPPED:
        ck.tree_remove(C, S, p, Tree.UNMAPPED)
        ck.absorb_next(C, S, p)
        b = p
    nx = C[b, F.NEXT]
    if nx != -1 and C[nx, F.STATE] == P.UNMAPPED:
        ck.tree_remove(C, S, nx, Tree.UNMAPPED)
        ck.absorb_next(C, S, b)
    ck.tree_insert(C, S, b, Tree.UNMAPPED)
    S[Slot.RESERVED] -= end - begin
    S[Slot.DEV_USED] -= end - begin
    _emit_pages(R, S, i, Op.SEGMENT_FREE, begin, end - begin, pg, stream[g])


@njit(cache=True, error_model="numpy")
def unmap_all_free(C, S, R, i, stream, X):  # pragma: no cover - compiled
    """Unmap the whole pages of every free mapped piece, in (group, size, address) order."""
    if X.shape[0] == 0 or X[:, X_.MADE].max() == Reserve.NONE:
        return
    k = 0
    x = ck.tree_first(C, S, Tree.FREE)
    if x == -1:
        return
    ids = np.empty(S[Slot.NALIVE], dtype=np.int64)
    while x != -1:
        if C[x, F.EXP] != -1:
            ids[k] = x
            k += 1
        x = ck.succ(C, x, Tree.FREE)
    for j in range(k):
        _unmap(C, S, R, i, ids[j], stream, X)
