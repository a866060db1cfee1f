"""Chunk store shared by the pool models (CuPy's pool, PyTorch's caching allocator).

Every piece of pool memory (a free chunk, a live block, an unmapped range of an
expandable segment) is one row of an int64 matrix ``C[id, field]``. Pieces of
one device allocation are linked in address order (``PREV``/``NEXT``). Free
mapped pieces sit in tree 0, a treap ordered by (group, size, address): a
lower bound on (group, s) is best fit with ties to the lowest address.
Unmapped pieces sit in tree 1, ordered by (group, address). A group is a CuPy
arena (one per stream) or a PyTorch (pool, stream) pair. Free pieces that are
a whole non-expandable device allocation are also on a doubly linked list, so
"release every unsplit free chunk" costs the number released, not the number
cached. Emitted allocator rows go to ``R[k] = (before, op, addr, size,
stream)``. Both matrices grow by doubling; callers reserve room before each
event (``room``/``rows_room``), so no helper ever reallocates. All counters
(bytes live, reserved, peaks, row counts) live in the int64 vector ``S``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.sim.policies._cupy_tree import (
    ADDR,
    ADDR_BASE,
    DEAD,
    DEV_USED,
    EXP,
    FREE,
    FREEL,
    GCBASE,
    GCL,
    GROUP,
    HHEAD,
    HNEXT,
    HPREV,
    HW,
    INW,
    L0,
    LIVE,
    MIB,
    NALIVE,
    NEXT,
    NEXT_ADDR,
    NF,
    NROWS,
    NS_SLOTS,
    OP_SEG_ALLOC,
    OP_SEG_FREE,
    PAGE,
    PEAK_LIVE,
    PEAK_RES,
    PREV,
    PRIO,
    RESERVED,
    RNG,
    ROOT0,
    ROOT1,
    SEGA,
    SEGEND,
    SEGF,
    SIZE,
    STATE,
    UNMAPPED,
    USED,
    WHEAD,
    WNEXT,
    WPREV,
    _less,
    find_free,
    first_in_group,
    last_in_group,
    lower_bound,
    pred,
    succ,
    tree_insert,
    tree_last,
    tree_remove,
)

# Kernels reach the layout and the trees through this module as ck.NAME.
__all__ = [
    "ADDR", "ADDR_BASE", "DEAD", "DEV_USED", "EXP", "FREE", "FREEL", "GCBASE", "GCL", "GROUP",
    "HHEAD", "HNEXT", "HPREV", "HW", "INW", "L0", "LIVE", "MIB", "NALIVE", "NEXT", "NEXT_ADDR",
    "NF", "NROWS", "NS_SLOTS", "OP_SEG_ALLOC", "OP_SEG_FREE", "PAGE", "PEAK_LIVE", "PEAK_RES",
    "PREV", "PRIO", "RESERVED", "RNG", "ROOT0", "ROOT1", "SEGA", "SEGEND", "SEGF", "SIZE", "STATE",
    "UNMAPPED", "USED", "WHEAD", "WNEXT", "WPREV", "_less", "find_free", "first_in_group",
    "last_in_group", "lower_bound", "pred", "succ", "tree_insert", "tree_last", "tree_remove",
]


def new_state(
    cap: int, rows_cap: int, next_addr: int = ADDR_BASE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty chunk matrix, row matrix and counters."""
    C = np.zeros((max(cap, 16), NF), dtype=np.int64)
    R = np.zeros((max(rows_cap, 16), 5), dtype=np.int64)
    S = np.zeros(NS_SLOTS, dtype=np.int64)
    S[ROOT0] = S[ROOT1] = S[FREEL] = S[WHEAD] = S[HHEAD] = -1
    S[RNG] = 0x9E3779B97F4A7C15 & 0x7FFFFFFFFFFFFFFF
    S[NEXT_ADDR] = next_addr
    return C, R, S


@njit(cache=True, error_model="numpy")
def room(C, S, extra):  # pragma: no cover - compiled
    """C with room for ``extra`` more live pieces (a new matrix if it had to grow)."""
    if C.shape[0] - S[NALIVE] >= extra:
        return C
    n = max(2 * C.shape[0], S[NALIVE] + extra)
    out = np.zeros((n, NF), dtype=np.int64)
    out[: C.shape[0]] = C
    return out


@njit(cache=True, error_model="numpy")
def rows_room(R, S, extra):  # pragma: no cover - compiled
    if R.shape[0] - S[NROWS] >= extra:
        return R
    out = np.zeros((max(2 * R.shape[0], S[NROWS] + extra), 5), dtype=np.int64)
    out[: R.shape[0]] = R
    return out


@njit(cache=True, error_model="numpy")
def emit(R, S, before, op, addr, size, stream):  # pragma: no cover - compiled
    k = S[NROWS]
    R[k, 0] = before
    R[k, 1] = op
    R[k, 2] = addr
    R[k, 3] = size
    R[k, 4] = stream
    S[NROWS] = k + 1
    if op == OP_SEG_ALLOC:
        S[SEGA] += 1
    else:
        S[SEGF] += 1


@njit(cache=True, error_model="numpy")
def new_node(C, S, addr, size, group, state):  # pragma: no cover - compiled
    x = S[FREEL]
    if x != -1:
        S[FREEL] = C[x, L0]
    else:
        x = S[HW]
        S[HW] = x + 1
    S[NALIVE] += 1
    r = S[RNG]  # xorshift64 for treap priorities
    r ^= (r << 13) & 0x7FFFFFFFFFFFFFFF
    r ^= r >> 7
    r ^= (r << 17) & 0x7FFFFFFFFFFFFFFF
    r &= 0x7FFFFFFFFFFFFFFF
    S[RNG] = r
    C[x, ADDR] = addr
    C[x, SIZE] = size
    C[x, GROUP] = group
    C[x, PREV] = -1
    C[x, NEXT] = -1
    C[x, STATE] = state
    C[x, PRIO] = r
    C[x, INW] = 0
    C[x, EXP] = -1
    return x


@njit(cache=True, error_model="numpy")
def kill(C, S, x):  # pragma: no cover - compiled
    C[x, STATE] = DEAD
    C[x, L0] = S[FREEL]
    S[FREEL] = x
    S[NALIVE] -= 1


@njit(cache=True, error_model="numpy")
def insert_free(C, S, x):  # pragma: no cover - compiled
    """Put piece x in the free tree (and on the whole-allocation list if unsplit)."""
    C[x, STATE] = FREE
    C[x, GCBASE] = S[GCL]  # PyTorch's gc_count_base: lookups counted when it was cached
    tree_insert(C, S, x, 0)
    if C[x, PREV] == -1 and C[x, NEXT] == -1 and C[x, EXP] == -1:
        h = S[WHEAD]
        C[x, INW] = 1
        C[x, WPREV] = -1
        C[x, WNEXT] = h
        if h != -1:
            C[h, WPREV] = x
        S[WHEAD] = x


@njit(cache=True, error_model="numpy")
def remove_free(C, S, x):  # pragma: no cover - compiled
    tree_remove(C, S, x, 0)
    if C[x, INW] == 1:
        p = C[x, WPREV]
        nx = C[x, WNEXT]
        if p == -1:
            S[WHEAD] = nx
        else:
            C[p, WNEXT] = nx
        if nx != -1:
            C[nx, WPREV] = p
        C[x, INW] = 0


@njit(cache=True, error_model="numpy")
def link_after(C, x, r):  # pragma: no cover - compiled
    """Put node r right after x in x's address-ordered list."""
    nx = C[x, NEXT]
    C[r, PREV] = x
    C[r, NEXT] = nx
    if nx != -1:
        C[nx, PREV] = r
    C[x, NEXT] = r


@njit(cache=True, error_model="numpy")
def link_before(C, x, f):  # pragma: no cover - compiled
    """Put node f right before x in x's address-ordered list."""
    p = C[x, PREV]
    C[f, PREV] = p
    C[f, NEXT] = x
    if p != -1:
        C[p, NEXT] = f
    C[x, PREV] = f


@njit(cache=True, error_model="numpy")
def split_front(C, S, x, s):  # pragma: no cover - compiled
    """Cut x to its first s bytes; the rest becomes a free piece right after it."""
    r = new_node(C, S, C[x, ADDR] + s, C[x, SIZE] - s, C[x, GROUP], FREE)
    C[r, EXP] = C[x, EXP]
    link_after(C, x, r)
    C[x, SIZE] = s
    insert_free(C, S, r)
    return r


@njit(cache=True, error_model="numpy")
def absorb_next(C, S, x):  # pragma: no cover - compiled
    """Merge x's next piece (already out of every tree) into x and drop it."""
    nx = C[x, NEXT]
    C[x, SIZE] += C[nx, SIZE]
    nn = C[nx, NEXT]
    C[x, NEXT] = nn
    if nn != -1:
        C[nn, PREV] = x
    kill(C, S, nx)


@njit(cache=True, error_model="numpy")
def free_merge(C, S, x):  # pragma: no cover - compiled
    """Return a used piece to the pool, merging with free (mapped) neighbours."""
    nx = C[x, NEXT]
    if nx != -1 and C[nx, STATE] == FREE:
        remove_free(C, S, nx)
        absorb_next(C, S, x)
    p = C[x, PREV]
    if p != -1 and C[p, STATE] == FREE:
        remove_free(C, S, p)
        absorb_next(C, S, p)
        x = p
    insert_free(C, S, x)
    return x


@njit(cache=True, error_model="numpy")
def device_cost(s):  # pragma: no cover - compiled
    """Device bytes a cudaMalloc of s takes: s up to 1 MiB (shared pages), else whole 2 MiB pages."""
    if s <= MIB:
        return s
    return (s + PAGE - 1) // PAGE * PAGE


@njit(cache=True, error_model="numpy")
def add_segment(C, S, R, before, addr, size, group, stream):  # pragma: no cover - compiled
    """A new device allocation, wholly one used piece; addr < 0 invents the address."""
    if addr < 0:
        addr = S[NEXT_ADDR]
        S[NEXT_ADDR] = addr + (size + PAGE - 1) // PAGE * PAGE + PAGE
    x = new_node(C, S, addr, size, group, USED)
    h = S[HHEAD]
    C[x, SEGEND] = addr + size
    C[x, HPREV] = -1
    C[x, HNEXT] = h
    if h != -1:
        C[h, HPREV] = x
    S[HHEAD] = x
    S[RESERVED] += size
    S[DEV_USED] += device_cost(size)
    if S[RESERVED] > S[PEAK_RES]:
        S[PEAK_RES] = S[RESERVED]
    emit(R, S, before, OP_SEG_ALLOC, addr, size, stream)
    return x


@njit(cache=True, error_model="numpy")
def overlaps(C, S, X, a, end):  # pragma: no cover - compiled
    """True if [a, end) meets a live device allocation or an expandable reservation."""
    h = S[HHEAD]
    while h != -1:
        if C[h, ADDR] < end and a < C[h, SEGEND]:
            return True
        h = C[h, HNEXT]
    for g in range(X.shape[0]):  # noqa: SIM110 - a loop compiles, a generator does not
        if X[g, 2] != 0 and X[g, 0] < end and a < X[g, 0] + X[g, 3]:
            return True
    return False


@njit(cache=True, error_model="numpy")
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
    j = np.searchsorted(hints[0], i)
    while j < m and hints[0, j] == i:
        if hints[3, j] == 0 and (hints[2, j] == s or not exact):
            a = hints[1, j]
            hints[3, j] = 1
            if overlaps(C, S, X, a, a + s):
                return -1
            return a
        j += 1
    return -1


@njit(cache=True, error_model="numpy")
def release_whole(C, S, R, before, x, stream):  # pragma: no cover - compiled
    """Give a free whole device allocation back to the device."""
    remove_free(C, S, x)
    p = C[x, HPREV]
    nx = C[x, HNEXT]
    if p == -1:
        S[HHEAD] = nx
    else:
        C[p, HNEXT] = nx
    if nx != -1:
        C[nx, HPREV] = p
    S[RESERVED] -= C[x, SIZE]
    S[DEV_USED] -= device_cost(C[x, SIZE])
    emit(R, S, before, OP_SEG_FREE, C[x, ADDR], C[x, SIZE], stream[C[x, GROUP]])
    kill(C, S, x)


@njit(cache=True, error_model="numpy")
def release_all_whole(C, S, R, before, stream):  # pragma: no cover - compiled
    """Release every free whole allocation, in (group, size, address) order."""
    k = 0
    x = S[WHEAD]
    while x != -1:
        k += 1
        x = C[x, WNEXT]
    if k == 0:
        return 0
    ids = np.empty(k, dtype=np.int64)
    x = S[WHEAD]
    for j in range(k):
        ids[j] = x
        x = C[x, WNEXT]
    ids = ids[np.argsort(C[ids, ADDR], kind="mergesort")]
    ids = ids[np.argsort(C[ids, SIZE], kind="mergesort")]
    ids = ids[np.argsort(C[ids, GROUP], kind="mergesort")]
    for j in range(k):
        release_whole(C, S, R, before, ids[j], stream)
    return k


@njit(cache=True, error_model="numpy")
def place_at(C, S, R, before, addr, size, group, stream):  # pragma: no cover - compiled
    """Mark [addr, addr+size) used inside the free piece that holds it (initial state).

    Without such a piece the block becomes its own device allocation. Linear in
    the pieces alive: only used for the few rows that rebuild a starting state.
    """
    for x in range(S[HW]):
        if C[x, STATE] != FREE or C[x, GROUP] != group:
            continue
        a = C[x, ADDR]
        if a <= addr and addr + size <= a + C[x, SIZE]:
            remove_free(C, S, x)
            C[x, STATE] = USED
            if addr > a:
                split_front(C, S, x, addr - a)
                y = C[x, NEXT]
                remove_free(C, S, y)
                C[y, STATE] = USED
                insert_free(C, S, x)
                x = y
            if C[x, SIZE] > size:
                split_front(C, S, x, size)
            return x
    return add_segment(C, S, R, before, addr, size, group, stream[group])


@njit(cache=True, error_model="numpy")
def add_live(S, size):  # pragma: no cover - compiled
    S[LIVE] += size
    if S[LIVE] > S[PEAK_LIVE]:
        S[PEAK_LIVE] = S[LIVE]


@njit(cache=True, error_model="numpy")
def free_request(C, S, blk, status, mate, i):  # pragma: no cover - compiled
    """Input event i frees the block its malloc got: status 1 (done) or 3 (its malloc failed)."""
    m = mate[i]
    if m < 0 or status[m] != 1:
        status[i] = 3
        return
    status[i] = 1
    x = blk[m]
    if x < 0:
        return
    add_live(S, -C[x, SIZE])
    free_merge(C, S, x)
