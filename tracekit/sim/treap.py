"""An ordered set of free blocks for compiled allocator kernels: a treap in one array.

Each node is one row of an int64 array ``T`` (shape ``(capacity, width)``,
``width >= NFIELDS``; kernels keep their own per-block fields in the columns
after ``NFIELDS``). Nodes are ordered by the key ``(T[x, K1], T[x, K2])``
(lexicographic) and heap-ordered by a priority hashed from the key, so the
expected depth is O(log n) whatever the insertion order. Every node also
carries ``MX``, the largest ``SZ`` in its subtree, which turns "lowest key
whose size fits" into one O(log n) descent (first fit when keyed by address);
trees that do not need it pass ``aug=False`` and leave MX stale. Best fit
keys the tree by ``(size, address)`` instead. Several trees may share
one array (one root per tree); a root of -1 is the empty tree. All functions
return the (possibly new) root.
"""

from __future__ import annotations

import numpy as np
from numba import njit

K1, K2, SZ, MX, L, R, P, PR = range(8)
NFIELDS = 8
NIL = -1


@njit(cache=True, inline="always")
def _less(T, a, b1, b2):  # pragma: no cover - compiled
    return T[a, K1] < b1 or (T[a, K1] == b1 and T[a, K2] < b2)


@njit(cache=True, inline="always")
def _mx(T, x):  # pragma: no cover - compiled
    return T[x, MX] if x >= 0 else -1


@njit(cache=True, inline="always")
def _pull(T, x):  # pragma: no cover - compiled
    m = T[x, SZ]
    a = _mx(T, T[x, L])
    b = _mx(T, T[x, R])
    if a > m:
        m = a
    if b > m:
        m = b
    T[x, MX] = m


@njit(cache=True, inline="always")
def _prio(k1, k2):  # pragma: no cover - compiled
    # splitmix64 of the key: random with respect to key order, no state to carry.
    z = np.uint64(k1) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(k2) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z >> np.uint64(1))


@njit(cache=True)
def _rotate_up(T, root, x, aug):  # pragma: no cover - compiled
    p = T[x, P]
    g = T[p, P]
    if T[p, L] == x:
        b = T[x, R]
        T[p, L] = b
        T[x, R] = p
    else:
        b = T[x, L]
        T[p, R] = b
        T[x, L] = p
    if b >= 0:
        T[b, P] = p
    T[p, P] = x
    T[x, P] = g
    if g >= 0:
        if T[g, L] == p:
            T[g, L] = x
        else:
            T[g, R] = x
    else:
        root = x
    if aug:
        _pull(T, p)
        _pull(T, x)
    return root


@njit(cache=True)
def insert(T, root, x, aug):  # pragma: no cover - compiled
    """Insert node x (K1, K2, SZ set by the caller); keys must be unique.

    ``aug``: maintain MX (needed by the fit queries; best fit by size skips it)."""
    T[x, L] = NIL
    T[x, R] = NIL
    T[x, MX] = T[x, SZ]
    T[x, PR] = _prio(T[x, K1], T[x, K2])
    if root < 0:
        T[x, P] = NIL
        return x
    y = root
    s = T[x, SZ]
    k1 = T[x, K1]
    k2 = T[x, K2]
    while True:
        if aug and T[y, MX] < s:
            T[y, MX] = s
        if _less(T, y, k1, k2):  # y < x: go right
            c = T[y, R]
            if c < 0:
                T[y, R] = x
                break
        else:
            c = T[y, L]
            if c < 0:
                T[y, L] = x
                break
        y = c
    T[x, P] = y
    while T[x, P] >= 0 and T[T[x, P], PR] < T[x, PR]:
        root = _rotate_up(T, root, x, aug)
    return root


@njit(cache=True)
def remove(T, root, x, aug):  # pragma: no cover - compiled
    """Remove node x from the tree rooted at root."""
    while T[x, L] >= 0 and T[x, R] >= 0:
        a = T[x, L]
        b = T[x, R]
        c = a if T[a, PR] > T[b, PR] else b
        root = _rotate_up(T, root, c, aug)
    c = T[x, L] if T[x, L] >= 0 else T[x, R]
    p = T[x, P]
    if c >= 0:
        T[c, P] = p
    if p < 0:
        return c
    if T[p, L] == x:
        T[p, L] = c
    else:
        T[p, R] = c
    if aug:
        fix_up(T, p)
    return root


@njit(cache=True)
def fix_up(T, y):  # pragma: no cover - compiled
    """Recompute MX from y to the root after a size in y's subtree changed."""
    while y >= 0:
        old = T[y, MX]
        _pull(T, y)
        if T[y, MX] == old:
            return
        y = T[y, P]


@njit(cache=True)
def rekey(T, x, new_k1, new_sz):  # pragma: no cover - compiled
    """Change x's K1 and size in place (MX kept); the caller guarantees its order is unchanged."""
    T[x, K1] = new_k1
    T[x, SZ] = new_sz
    y = x
    while y >= 0:
        _pull(T, y)
        y = T[y, P]


@njit(cache=True)
def lower_bound(T, root, k1, k2):  # pragma: no cover - compiled
    """The node with the smallest key >= (k1, k2), or -1."""
    best = NIL
    y = root
    while y >= 0:
        if _less(T, y, k1, k2):
            y = T[y, R]
        else:
            best = y
            y = T[y, L]
    return best


@njit(cache=True)
def find(T, root, k1, k2):  # pragma: no cover - compiled
    """The node with key exactly (k1, k2), or -1."""
    y = lower_bound(T, root, k1, k2)
    if y >= 0 and T[y, K1] == k1 and T[y, K2] == k2:
        return y
    return NIL


@njit(cache=True)
def floor(T, root, k1, k2):  # pragma: no cover - compiled
    """The node with the largest key <= (k1, k2), or -1."""
    best = NIL
    y = root
    while y >= 0:
        if T[y, K1] < k1 or (T[y, K1] == k1 and T[y, K2] <= k2):
            best = y
            y = T[y, R]
        else:
            y = T[y, L]
    return best


@njit(cache=True)
def leftmost(T, root):  # pragma: no cover - compiled
    y = root
    if y < 0:
        return NIL
    while T[y, L] >= 0:
        y = T[y, L]
    return y


@njit(cache=True)
def rightmost(T, root):  # pragma: no cover - compiled
    y = root
    if y < 0:
        return NIL
    while T[y, R] >= 0:
        y = T[y, R]
    return y


@njit(cache=True)
def predecessor(T, x):  # pragma: no cover - compiled
    """The node just before x in key order, or -1."""
    if T[x, L] >= 0:
        return rightmost(T, T[x, L])
    while T[x, P] >= 0 and T[T[x, P], L] == x:
        x = T[x, P]
    return T[x, P]


@njit(cache=True)
def first_fit(T, root, size):  # pragma: no cover - compiled
    """The lowest-keyed node with SZ >= size, or -1 (uses MX)."""
    y = root
    if y < 0 or T[y, MX] < size:
        return NIL
    while True:
        a = T[y, L]
        if a >= 0 and T[a, MX] >= size:
            y = a
        elif T[y, SZ] >= size:
            return y
        else:
            y = T[y, R]


@njit(cache=True)
def first_fit_from(T, root, k1, size, stack):  # pragma: no cover - compiled
    """The lowest-keyed node with K1 >= k1 and SZ >= size, or -1.

    The nodes with K1 >= k1 are exactly the nodes where the search path for
    k1 turns left, each with its right subtree; trying them deepest first
    visits them in key order. ``stack`` is scratch space longer than any
    realistic treap path (expected depth ~2 ln n); the guard only keeps a
    pathological tree from writing past it.
    """
    depth = 0
    y = root
    while y >= 0 and depth < stack.shape[0]:
        if T[y, K1] < k1:
            y = T[y, R]
        else:
            stack[depth] = y
            depth += 1
            y = T[y, L]
    for d in range(depth - 1, -1, -1):
        y = stack[d]
        if T[y, SZ] >= size:
            return y
        r = T[y, R]
        if r >= 0 and T[r, MX] >= size:
            return first_fit(T, r, size)
    return NIL
