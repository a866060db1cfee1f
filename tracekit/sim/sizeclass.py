"""Free blocks segregated by size class, for an exact best fit in near-constant time.

A block of ``g = size // 512`` granules belongs to class ``g`` while
``g < 2**16`` (exact classes up to 32 MiB) and above that to one of 64
sub-classes per power of two (``class = 2**16 + 64 * (log2(g) - 16) +
the 6 bits after the leading one``), so the class grows with the size. Each
class holds its blocks in a treap keyed by ``(size, address)``
(``tracekit.sim.treap``; all classes share one node array), and a
three-level bitmap over the classes finds the next non-empty class with a
few word operations. Best fit for a request of r bytes: the smallest
``(size, address)`` >= ``(r, 0)`` in r's own class, else the first block of
the next non-empty class. Only trees of one class are ever searched, and
they are small, so each operation costs a handful of memory accesses.
"""

from __future__ import annotations

import numpy as np

from tracekit.compiled import plain
from tracekit.sim import treap
from tracekit.sim.treap import SZ

AT = 0  # the treap's columns start the row

EXACT_BITS = 16
SUB_BITS = 6
MAX_LOG = 62
NCLASSES = (1 << EXACT_BITS) + (MAX_LOG - EXACT_BITS + 1) * (1 << SUB_BITS)
W0 = (NCLASSES + 63) // 64  # level-0 words: one bit per class
W1 = (W0 + 63) // 64  # level-1 words: one bit per non-empty level-0 word
# Bitmap layout in one int64 array: [level 2 (one word) | level 1 | level 0].
OFF1 = 1
OFF0 = 1 + W1
BITMAP_WORDS = OFF0 + W0
assert W1 <= 64

_DEBRUIJN = 0x03F79D71B4CB0A89
_CTZ = np.zeros(64, np.int64)
for _i in range(64):
    _CTZ[(((1 << _i) * _DEBRUIJN) % (1 << 64)) >> 58] = _i


def new_tables() -> tuple[np.ndarray, np.ndarray]:
    """Empty class roots and bitmap."""
    return np.full(NCLASSES, -1, np.int64), np.zeros(BITMAP_WORDS, np.int64)


@plain(inline="always")
def _ctz(x):  # pragma: no cover - compiled
    """Index of the lowest set bit of a non-zero int64."""
    low = x & -x
    return _CTZ[((low * _DEBRUIJN) >> 58) & 63]


@plain(inline="always")
def _floor_log2(g):  # pragma: no cover - compiled
    e = 0
    for s in (32, 16, 8, 4, 2, 1):
        if g >> s:
            g >>= s
            e += s
    return e


@plain
def klass(size):  # pragma: no cover - compiled
    """The class of a block (or request) of ``size`` bytes."""
    g = size >> 9
    if g < (1 << EXACT_BITS):
        return g
    e = _floor_log2(g)
    sub = (g >> (e - SUB_BITS)) & ((1 << SUB_BITS) - 1)
    return (1 << EXACT_BITS) + ((e - EXACT_BITS) << SUB_BITS) + sub


@plain(inline="always")
def _set(bm, c):  # pragma: no cover - compiled
    w = c >> 6
    if bm[OFF0 + w] == 0:
        w1 = w >> 6
        if bm[OFF1 + w1] == 0:
            bm[0] |= np.int64(1) << w1
        bm[OFF1 + w1] |= np.int64(1) << (w & 63)
    bm[OFF0 + w] |= np.int64(1) << (c & 63)


@plain(inline="always")
def _clear(bm, c):  # pragma: no cover - compiled
    w = c >> 6
    bm[OFF0 + w] &= ~(np.int64(1) << (c & 63))
    if bm[OFF0 + w] == 0:
        w1 = w >> 6
        bm[OFF1 + w1] &= ~(np.int64(1) << (w & 63))
        if bm[OFF1 + w1] == 0:
            bm[0] &= ~(np.int64(1) << w1)


@plain
def next_class(bm, c):  # pragma: no cover - compiled
    """The first non-empty class >= c, or -1."""
    if c >= NCLASSES:
        return -1
    w = c >> 6
    m = bm[OFF0 + w] & (np.int64(-1) << (c & 63))
    if m:
        return (w << 6) + _ctz(m)
    w += 1  # next level-0 word with a bit set
    if w >= W0:
        return -1
    w1 = w >> 6
    m = bm[OFF1 + w1] & (np.int64(-1) << (w & 63))
    if not m:
        w1 += 1
        if w1 >= W1:
            return -1
        m2 = bm[0] & (np.int64(-1) << w1)
        if not m2:
            return -1
        w1 = _ctz(m2)
        m = bm[OFF1 + w1]
    w = (w1 << 6) + _ctz(m)
    return (w << 6) + _ctz(bm[OFF0 + w])


@plain
def last_class(bm):  # pragma: no cover - compiled
    """The highest non-empty class, or -1 (a scan: for rare queries only)."""
    for w in range(W0 - 1, -1, -1):
        m = bm[OFF0 + w]
        if m:
            c = (w << 6) + 63
            while not (m >> (c & 63)) & 1:
                c -= 1
            return c
    return -1


@plain
def add(T, roots, bm, x):  # pragma: no cover - compiled
    """Insert free block x (K1 = size, K2 = address, K3 = 0 already set)."""
    c = klass(T[x, SZ])
    if roots[c] < 0:
        _set(bm, c)
    roots[c] = treap.insert(T, roots[c], x, False, AT)


@plain
def drop(T, roots, bm, x):  # pragma: no cover - compiled
    c = klass(T[x, SZ])
    roots[c] = treap.remove(T, roots[c], x, False, AT)
    if roots[c] < 0:
        _clear(bm, c)


@plain
def best(T, roots, bm, r):  # pragma: no cover - compiled
    """The free block with the smallest (size, address) whose size >= r, or -1."""
    c = klass(r)
    if c >= NCLASSES:
        return -1
    if roots[c] >= 0:
        x = treap.lower_bound(T, roots[c], r, 0, 0, AT)
        if x >= 0:
            return x
    return _first_above(T, roots, bm, c)


@plain
def after(T, roots, bm, x):  # pragma: no cover - compiled
    """The free block next after x in (size, address) order, or -1 (x is in the index)."""
    y = treap.successor(T, x, AT)
    if y >= 0:
        return y
    return _first_above(T, roots, bm, klass(T[x, SZ]))


@plain(inline="always")
def _first_above(T, roots, bm, c):  # pragma: no cover - compiled
    """The smallest block of the first non-empty class above class c, or -1."""
    c = next_class(bm, c + 1)
    if c < 0:
        return -1
    return treap.leftmost(T, roots[c], AT)


@plain
def largest(T, roots, bm):  # pragma: no cover - compiled
    c = last_class(bm)
    if c < 0:
        return 0
    return T[treap.rightmost(T, roots[c], AT), SZ]
