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

# Fields of C.
(ADDR, SIZE, GROUP, PREV, NEXT, STATE, PRIO, INW, WPREV, WNEXT, EXP, HPREV, HNEXT, SEGEND, GCBASE,
 L0) = range(16)
NF = L0 + 6  # tree t uses L0 + 3t (left), +1 (right), +2 (parent)
# STATE values.
FREE, USED, UNMAPPED, DEAD = 0, 1, 2, 3
# Slots of S.
(ROOT0, ROOT1, RNG, HW, FREEL, NALIVE, WHEAD, NROWS, LIVE, RESERVED, PEAK_LIVE, PEAK_RES,
 NEXT_ADDR, DEV_USED, SEGA, SEGF, HHEAD, GCL) = range(18)
NS_SLOTS = 18
OP_SEG_ALLOC, OP_SEG_FREE = 2, 3
MIB = 1 << 20
PAGE = 2 * MIB
ADDR_BASE = 1 << 40  # invented device addresses start here (far from 0 and from real ones)


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
def _less(C, x, y, t):  # pragma: no cover - compiled
    gx = C[x, GROUP]
    gy = C[y, GROUP]
    if gx != gy:
        return gx < gy
    if t == 0:
        sx = C[x, SIZE]
        sy = C[y, SIZE]
        if sx != sy:
            return sx < sy
    return C[x, ADDR] < C[y, ADDR]


@njit(cache=True, error_model="numpy")
def _rotate_up(C, S, x, t):  # pragma: no cover - compiled
    L = L0 + 3 * t
    R = L + 1
    P = L + 2
    p = C[x, P]
    g = C[p, P]
    if C[p, L] == x:
        b = C[x, R]
        C[p, L] = b
        if b != -1:
            C[b, P] = p
        C[x, R] = p
    else:
        b = C[x, L]
        C[p, R] = b
        if b != -1:
            C[b, P] = p
        C[x, L] = p
    C[p, P] = x
    C[x, P] = g
    if g == -1:
        S[ROOT0 + t] = x
    elif C[g, L] == p:
        C[g, L] = x
    else:
        C[g, R] = x


@njit(cache=True, error_model="numpy")
def tree_insert(C, S, x, t):  # pragma: no cover - compiled
    L = L0 + 3 * t
    R = L + 1
    P = L + 2
    C[x, L] = -1
    C[x, R] = -1
    cur = S[ROOT0 + t]
    if cur == -1:
        C[x, P] = -1
        S[ROOT0 + t] = x
        return
    while True:
        if _less(C, x, cur, t):
            nx = C[cur, L]
            if nx == -1:
                C[cur, L] = x
                break
        else:
            nx = C[cur, R]
            if nx == -1:
                C[cur, R] = x
                break
        cur = nx
    C[x, P] = cur
    while C[x, P] != -1 and C[C[x, P], PRIO] < C[x, PRIO]:
        _rotate_up(C, S, x, t)


@njit(cache=True, error_model="numpy")
def tree_remove(C, S, x, t):  # pragma: no cover - compiled
    L = L0 + 3 * t
    R = L + 1
    P = L + 2
    while C[x, L] != -1 and C[x, R] != -1:
        lc = C[x, L]
        rc = C[x, R]
        _rotate_up(C, S, lc if C[lc, PRIO] > C[rc, PRIO] else rc, t)
    child = C[x, L] if C[x, L] != -1 else C[x, R]
    p = C[x, P]
    if child != -1:
        C[child, P] = p
    if p == -1:
        S[ROOT0 + t] = child
    elif C[p, L] == x:
        C[p, L] = child
    else:
        C[p, R] = child


@njit(cache=True, error_model="numpy")
def lower_bound(C, S, g, s):  # pragma: no cover - compiled
    """Tree 0: the first free piece with (group, size) >= (g, s), or -1."""
    cur = S[ROOT0]
    best = -1
    while cur != -1:
        gc = C[cur, GROUP]
        if gc > g or (gc == g and C[cur, SIZE] >= s):
            best = cur
            cur = C[cur, L0]
        else:
            cur = C[cur, L0 + 1]
    return best


@njit(cache=True, error_model="numpy")
def find_free(C, S, g, s, a):  # pragma: no cover - compiled
    """Tree 0: the free piece with key exactly (g, s, a), or -1."""
    cur = S[ROOT0]
    while cur != -1:
        gc = C[cur, GROUP]
        sc = C[cur, SIZE]
        ac = C[cur, ADDR]
        if gc == g and sc == s and ac == a:
            return cur
        right = gc < g or (gc == g and (sc < s or (sc == s and ac < a)))
        cur = C[cur, L0 + 1] if right else C[cur, L0]
    return -1


@njit(cache=True, error_model="numpy")
def first_in_group(C, S, g, t):  # pragma: no cover - compiled
    """The smallest key of group g in tree t, or -1."""
    cur = S[ROOT0 + t]
    best = -1
    while cur != -1:
        if C[cur, GROUP] >= g:
            best = cur
            cur = C[cur, L0 + 3 * t]
        else:
            cur = C[cur, L0 + 3 * t + 1]
    if best != -1 and C[best, GROUP] != g:
        return -1
    return best


@njit(cache=True, error_model="numpy")
def last_in_group(C, S, g, t):  # pragma: no cover - compiled
    """The largest key of group g in tree t (tree 0: the largest free piece), or -1."""
    cur = S[ROOT0 + t]
    best = -1
    while cur != -1:
        if C[cur, GROUP] <= g:
            best = cur
            cur = C[cur, L0 + 3 * t + 1]
        else:
            cur = C[cur, L0 + 3 * t]
    if best != -1 and C[best, GROUP] != g:
        return -1
    return best


@njit(cache=True, error_model="numpy")
def tree_last(C, S, t):  # pragma: no cover - compiled
    cur = S[ROOT0 + t]
    if cur == -1:
        return -1
    while C[cur, L0 + 3 * t + 1] != -1:
        cur = C[cur, L0 + 3 * t + 1]
    return cur


@njit(cache=True, error_model="numpy")
def succ(C, x, t):  # pragma: no cover - compiled
    L = L0 + 3 * t
    R = L + 1
    P = L + 2
    if C[x, R] != -1:
        x = C[x, R]
        while C[x, L] != -1:
            x = C[x, L]
        return x
    p = C[x, P]
    while p != -1 and C[p, R] == x:
        x = p
        p = C[p, P]
    return p


@njit(cache=True, error_model="numpy")
def pred(C, x, t):  # pragma: no cover - compiled
    L = L0 + 3 * t
    R = L + 1
    P = L + 2
    if C[x, L] != -1:
        x = C[x, L]
        while C[x, R] != -1:
            x = C[x, R]
        return x
    p = C[x, P]
    while p != -1 and C[p, L] == x:
        x = p
        p = C[p, P]
    return p


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
def split_front(C, S, x, s):  # pragma: no cover - compiled
    """Cut x to its first s bytes; the rest becomes a free piece right after it."""
    r = new_node(C, S, C[x, ADDR] + s, C[x, SIZE] - s, C[x, GROUP], FREE)
    C[r, EXP] = C[x, EXP]
    nx = C[x, NEXT]
    C[r, PREV] = x
    C[r, NEXT] = nx
    if nx != -1:
        C[nx, PREV] = r
    C[x, NEXT] = r
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
