"""Device allocations of the pool models' chunk store: create, find an address, release.

A device allocation (a CuPy arena's ``cudaMalloc``, a PyTorch segment) starts
as one used piece of the chunk store (``tracekit.sim.chunks``) and is on the
list of live allocations (``HPREV``/``HNEXT``) until it is released whole.
``device_cost`` is what the driver takes for it: s bytes up to 1 MiB (small
allocations share pages), else whole 2 MiB pages. A replay of a recording
gives a new allocation the address the recorded allocator got
(``recorded_addr``), so later ties broken by address fall as on the GPU;
otherwise addresses are invented from ``ADDR_BASE`` upwards, a page apart.
Releasing emits a ``segment_free`` row; ``release_all_whole`` releases every
free unsplit allocation in (group, size, address) order, as CuPy's
``free_all_blocks`` and PyTorch's ``release_cached_blocks`` do.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import chunks as ck
from tracekit.sim.chunks import MIB, PAGE
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Hint, Op, Reserve, Slot
from tracekit.sim.codes import Piece as P
from tracekit.sim.codes import Reservation as X_


@plain(error_model="numpy")
def device_cost(s):  # pragma: no cover - compiled
    """Device bytes a cudaMalloc of s takes: s up to 1 MiB (shared pages), else whole 2 MiB pages."""
    if s <= MIB:
        return s
    return (s + PAGE - 1) // PAGE * PAGE


@plain(error_model="numpy")
def add_segment(C, S, R, before, addr, size, group, stream):  # pragma: no cover - compiled
    """A new device allocation, wholly one used piece; addr < 0 invents the address."""
    if addr < 0:
        addr = S[Slot.NEXT_ADDR]
        S[Slot.NEXT_ADDR] = addr + (size + PAGE - 1) // PAGE * PAGE + PAGE
    x = ck.new_node(C, S, addr, size, group, P.USED)
    h = S[Slot.HHEAD]
    C[x, F.SEGEND] = addr + size
    C[x, F.HPREV] = -1
    C[x, F.HNEXT] = h
    if h != -1:
        C[h, F.HPREV] = x
    S[Slot.HHEAD] = x
    S[Slot.RESERVED] += size
    S[Slot.DEV_USED] += device_cost(size)
    if S[Slot.RESERVED] > S[Slot.PEAK_RES]:
        S[Slot.PEAK_RES] = S[Slot.RESERVED]
    ck.emit(R, S, before, Op.SEGMENT_ALLOC, addr, size, stream)
    return x


@plain(error_model="numpy")
def overlaps(C, S, X, a, end):  # pragma: no cover - compiled
    """True if [a, end) meets a live device allocation or an expandable reservation."""
    h = S[Slot.HHEAD]
    while h != -1:
        if C[h, F.ADDR] < end and a < C[h, F.SEGEND]:
            return True
        h = C[h, F.HNEXT]
    for g in range(X.shape[0]):
        if X[g, X_.MADE] != Reserve.NONE and X[g, X_.BASE] < end and a < X[g, X_.BASE] + X[g, X_.VSIZE]:
            return True
    return False


@plain(error_model="numpy")
def recorded_addr(C, S, X, i, s, hints, exact):  # pragma: no cover - compiled
    """The device address the recorded allocator got for this allocation, or -1 to invent one.

    ``hints`` holds the recorded ``segment_alloc`` rows as columns: the
    request each precedes (non-decreasing), addr, size, and a taken flag. The
    first untaken one before request i of size s (any size unless ``exact``)
    gives its address, unless that range is in use in the replay.
    """
    m = hints.shape[1]
    if m == 0:
        return -1
    j = np.searchsorted(hints[Hint.BEFORE], i)
    while j < m and hints[Hint.BEFORE, j] == i:
        if hints[Hint.TAKEN, j] == 0 and (hints[Hint.SIZE, j] == s or not exact):
            a = hints[Hint.ADDR, j]
            hints[Hint.TAKEN, j] = 1
            if overlaps(C, S, X, a, a + s):
                return -1
            return a
        j += 1
    return -1


@plain(error_model="numpy")
def release_whole(C, S, R, before, x, stream):  # pragma: no cover - compiled
    """Give a free whole device allocation back to the device."""
    ck.remove_free(C, S, x)
    p = C[x, F.HPREV]
    nx = C[x, F.HNEXT]
    if p == -1:
        S[Slot.HHEAD] = nx
    else:
        C[p, F.HNEXT] = nx
    if nx != -1:
        C[nx, F.HPREV] = p
    S[Slot.RESERVED] -= C[x, F.SIZE]
    S[Slot.DEV_USED] -= device_cost(C[x, F.SIZE])
    ck.emit(R, S, before, Op.SEGMENT_FREE, C[x, F.ADDR], C[x, F.SIZE], stream[C[x, F.GROUP]])
    ck.kill(C, S, x)


@njit(cache=True, error_model="numpy")
def release_all_whole(C, S, R, before, stream):  # pragma: no cover - compiled
    """Release every free whole allocation, in (group, size, address) order."""
    return release_whole_in(C, S, R, before, stream, -1)


@njit(cache=True, error_model="numpy")
def whole_free_in(C, S, group):  # pragma: no cover - compiled
    """The wholly free device allocations of ``group`` (-1: of every group), by address."""
    k = 0
    x = S[Slot.WHEAD]
    while x != -1:
        if group < 0 or C[x, F.GROUP] == group:
            k += 1
        x = C[x, F.WNEXT]
    ids = np.empty(k, dtype=np.int64)
    x = S[Slot.WHEAD]
    j = 0
    while x != -1:
        if group < 0 or C[x, F.GROUP] == group:
            ids[j] = x
            j += 1
        x = C[x, F.WNEXT]
    return ids[np.argsort(C[ids, F.ADDR], kind="mergesort")]


@njit(cache=True, error_model="numpy")
def release_whole_in(C, S, R, before, stream, group):  # pragma: no cover - compiled
    """Release every free whole allocation of ``group`` (-1: of every group), in (group, size,
    address) order, as CuPy's ``free_all_blocks(stream)`` releases one arena."""
    ids = whole_free_in(C, S, group)
    k = len(ids)
    if k == 0:
        return 0
    ids = ids[np.argsort(C[ids, F.SIZE], kind="mergesort")]
    ids = ids[np.argsort(C[ids, F.GROUP], kind="mergesort")]
    for j in range(k):
        release_whole(C, S, R, before, ids[j], stream)
    return k


@plain(error_model="numpy")
def place_at(C, S, R, before, addr, size, group, stream):  # pragma: no cover - compiled
    """Mark [addr, addr+size) used inside the free piece that holds it (initial state).

    Without such a piece the block becomes its own device allocation. Linear in
    the pieces alive: only used for the few rows that rebuild a starting state.
    """
    for x in range(S[Slot.HW]):
        if C[x, F.STATE] != P.FREE or C[x, F.GROUP] != group:
            continue
        a = C[x, F.ADDR]
        if a <= addr and addr + size <= a + C[x, F.SIZE]:
            ck.remove_free(C, S, x)
            C[x, F.STATE] = P.USED
            if addr > a:
                ck.split_front(C, S, x, addr - a)
                y = C[x, F.NEXT]
                ck.remove_free(C, S, y)
                C[y, F.STATE] = P.USED
                ck.insert_free(C, S, x)
                x = y
            if C[x, F.SIZE] > size:
                ck.split_front(C, S, x, size)
            return x
    return add_segment(C, S, R, before, addr, size, group, stream[group])
