"""The one ordered set of the simulator's compiled kernels: a treap stored in rows of an array.

Each node is one row of an int64 array ``T``; a tree uses a block of columns
starting at offset ``o`` (so one array can hold several trees, or a tree beside
a kernel's own per-node fields): the key ``(K1, K2, K3)`` (lexicographic,
unique), the links ``L``, ``R``, ``P`` (-1 = none) and the priority ``PR``,
hashed from the key, so the expected depth is O(log n) whatever the order of
operations and no generator state is carried. An augmented tree (``aug``) also
keeps ``SZ`` and ``MX``, the largest ``SZ`` in the subtree, which turns "lowest
key whose size fits" into one O(log n) descent (first fit when keyed by
address); trees that do not need it pass ``aug=False`` and use only the first
``TREE_FIELDS`` columns. Users: the free lists (keyed by address, or by (size,
address)), the buddy allocator (one tree per order), the size classes of best
fit, and the pool models' chunk store (free pieces by (group, size, address),
unmapped pieces by (group, address)). Functions that restructure a tree return
its (possibly new) root; -1 is the empty tree.
"""

from __future__ import annotations

import numpy as np

from tracekit.compiled import plain
from tracekit.sim.codes import NFIELDS, TREE_FIELDS

K1, K2, K3, L, R, P, PR, SZ, MX = range(9)
assert TREE_FIELDS == PR + 1 and NFIELDS == MX + 1  # K1..PR: a tree without size augmentation; + SZ, MX
NIL = -1


@plain(inline="always")
def _less(T, a, b1, b2, b3, o):  # pragma: no cover - compiled
    """Key of node a < (b1, b2, b3)."""
    a1 = T[a, o + K1]
    if a1 != b1:
        return a1 < b1
    a2 = T[a, o + K2]
    if a2 != b2:
        return a2 < b2
    return T[a, o + K3] < b3


@plain(inline="always")
def _mx(T, x, o):  # pragma: no cover - compiled
    return T[x, o + MX] if x >= 0 else -1


@plain(inline="always")
def _pull(T, x, o):  # pragma: no cover - compiled
    m = T[x, o + SZ]
    a = _mx(T, T[x, o + L], o)
    b = _mx(T, T[x, o + R], o)
    if a > m:
        m = a
    if b > m:
        m = b
    T[x, o + MX] = m


@plain(inline="always")
def _prio(k1, k2, k3):  # pragma: no cover - compiled
    # splitmix64 of the key: random with respect to key order, no state to carry.
    z = (np.uint64(k1) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(k2)) * np.uint64(0xD6E8FEB86659FD93)
    z = z + np.uint64(k3) + np.uint64(0x632BE59BD9B4E019)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z >> np.uint64(1))


@plain
def _rotate_up(T, root, x, aug, o):  # pragma: no cover - compiled
    p = T[x, o + P]
    g = T[p, o + P]
    if T[p, o + L] == x:
        b = T[x, o + R]
        T[p, o + L] = b
        T[x, o + R] = p
    else:
        b = T[x, o + L]
        T[p, o + R] = b
        T[x, o + L] = p
    if b >= 0:
        T[b, o + P] = p
    T[p, o + P] = x
    T[x, o + P] = g
    if g >= 0:
        if T[g, o + L] == p:
            T[g, o + L] = x
        else:
            T[g, o + R] = x
    else:
        root = x
    if aug:
        _pull(T, p, o)
        _pull(T, x, o)
    return root


@plain
def insert(T, root, x, aug, o):  # pragma: no cover - compiled
    """Insert node x (its key, and SZ when ``aug``, set by the caller); keys must be unique."""
    T[x, o + L] = NIL
    T[x, o + R] = NIL
    k1 = T[x, o + K1]
    k2 = T[x, o + K2]
    k3 = T[x, o + K3]
    T[x, o + PR] = _prio(k1, k2, k3)
    s = 0
    if aug:
        s = T[x, o + SZ]
        T[x, o + MX] = s
    if root < 0:
        T[x, o + P] = NIL
        return x
    y = root
    while True:
        if aug and T[y, o + MX] < s:
            T[y, o + MX] = s
        if _less(T, y, k1, k2, k3, o):  # y < x: go right
            c = T[y, o + R]
            if c < 0:
                T[y, o + R] = x
                break
        else:
            c = T[y, o + L]
            if c < 0:
                T[y, o + L] = x
                break
        y = c
    T[x, o + P] = y
    while T[x, o + P] >= 0 and T[T[x, o + P], o + PR] < T[x, o + PR]:
        root = _rotate_up(T, root, x, aug, o)
    return root


@plain
def remove(T, root, x, aug, o):  # pragma: no cover - compiled
    """Remove node x from the tree rooted at root."""
    while T[x, o + L] >= 0 and T[x, o + R] >= 0:
        a = T[x, o + L]
        b = T[x, o + R]
        c = a if T[a, o + PR] > T[b, o + PR] else b
        root = _rotate_up(T, root, c, aug, o)
    c = T[x, o + L] if T[x, o + L] >= 0 else T[x, o + R]
    p = T[x, o + P]
    if c >= 0:
        T[c, o + P] = p
    if p < 0:
        return c
    if T[p, o + L] == x:
        T[p, o + L] = c
    else:
        T[p, o + R] = c
    if aug:
        fix_up(T, p, o)
    return root


@plain
def fix_up(T, y, o):  # pragma: no cover - compiled
    """Recompute MX from y to the root after a size in y's subtree changed."""
    while y >= 0:
        old = T[y, o + MX]
        _pull(T, y, o)
        if T[y, o + MX] == old:
            return
        y = T[y, o + P]


@plain
def rekey(T, x, new_k1, new_sz, o):  # pragma: no cover - compiled
    """Change x's K1 and size in place (priority kept); the caller guarantees its order is unchanged."""
    T[x, o + K1] = new_k1
    T[x, o + SZ] = new_sz
    y = x
    while y >= 0:
        _pull(T, y, o)
        y = T[y, o + P]


@plain
def lower_bound(T, root, k1, k2, k3, o):  # pragma: no cover - compiled
    """The node with the smallest key >= (k1, k2, k3), or -1."""
    best = NIL
    y = root
    while y >= 0:
        if _less(T, y, k1, k2, k3, o):
            y = T[y, o + R]
        else:
            best = y
            y = T[y, o + L]
    return best


@plain
def find(T, root, k1, k2, k3, o):  # pragma: no cover - compiled
    """The node with key exactly (k1, k2, k3), or -1."""
    y = lower_bound(T, root, k1, k2, k3, o)
    if y >= 0 and T[y, o + K1] == k1 and T[y, o + K2] == k2 and T[y, o + K3] == k3:
        return y
    return NIL


@plain
def floor(T, root, k1, k2, k3, o):  # pragma: no cover - compiled
    """The node with the largest key <= (k1, k2, k3), or -1."""
    best = NIL
    y = root
    while y >= 0:
        if _less(T, y, k1, k2, k3, o) or (
                T[y, o + K1] == k1 and T[y, o + K2] == k2 and T[y, o + K3] == k3):
            best = y
            y = T[y, o + R]
        else:
            y = T[y, o + L]
    return best


@plain
def leftmost(T, root, o):  # pragma: no cover - compiled
    y = root
    if y < 0:
        return NIL
    while T[y, o + L] >= 0:
        y = T[y, o + L]
    return y


@plain
def rightmost(T, root, o):  # pragma: no cover - compiled
    y = root
    if y < 0:
        return NIL
    while T[y, o + R] >= 0:
        y = T[y, o + R]
    return y


@plain
def predecessor(T, x, o):  # pragma: no cover - compiled
    """The node just before x in key order, or -1."""
    if T[x, o + L] >= 0:
        return rightmost(T, T[x, o + L], o)
    while T[x, o + P] >= 0 and T[T[x, o + P], o + L] == x:
        x = T[x, o + P]
    return T[x, o + P]


@plain
def successor(T, x, o):  # pragma: no cover - compiled
    """The node just after x in key order, or -1."""
    if T[x, o + R] >= 0:
        return leftmost(T, T[x, o + R], o)
    while T[x, o + P] >= 0 and T[T[x, o + P], o + R] == x:
        x = T[x, o + P]
    return T[x, o + P]


@plain
def first_fit(T, root, size, o):  # pragma: no cover - compiled
    """The lowest-keyed node with SZ >= size, or -1 (augmented trees)."""
    y = root
    if y < 0 or T[y, o + MX] < size:
        return NIL
    while True:
        a = T[y, o + L]
        if a >= 0 and T[a, o + MX] >= size:
            y = a
        elif T[y, o + SZ] >= size:
            return y
        else:
            y = T[y, o + R]


@plain
def first_fit_from(T, root, k1, size, stack, o):  # pragma: no cover - compiled
    """The lowest-keyed node with K1 >= k1 and SZ >= size, or -1 (augmented trees).

    The nodes with K1 >= k1 are exactly the nodes where the search path for
    k1 turns left, each with its right subtree; trying them deepest first
    visits them in key order. ``stack`` is scratch space longer than any
    realistic treap path (expected depth ~2 ln n); the guard only keeps a
    pathological tree from writing past it.
    """
    depth = 0
    y = root
    while y >= 0 and depth < stack.shape[0]:
        if T[y, o + K1] < k1:
            y = T[y, o + R]
        else:
            stack[depth] = y
            depth += 1
            y = T[y, o + L]
    for d in range(depth - 1, -1, -1):
        y = stack[d]
        if T[y, o + SZ] >= size:
            return y
        r = T[y, o + R]
        if r >= 0 and T[r, o + MX] >= size:
            return first_fit(T, r, size, o)
    return NIL
