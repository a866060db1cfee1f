"""Layout of the pool models' chunk store, and its two treaps.

``C[id, field]`` rows are pieces of pool memory (fields below); ``S`` holds
roots and counters. Tree 0 orders free mapped pieces by (group, size,
address), so a lower bound on (group, s) is best fit with ties to the lowest
address; tree 1 orders unmapped pieces by (group, address). Treap priorities
are random (xorshift in ``S[RNG]``), so the expected depth is O(log n)
whatever the order of operations; nodes keep parent links, so insert and
remove are iterative rotations and ``succ``/``pred`` walk in order.
"""

from __future__ import annotations

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
