"""The compiled free-list kernel behind the ``first-fit``, ``best-fit``, ``next-fit``
and ``worst-fit`` policies (see ``freelist`` for what each policy does).

Every block (free or in use) is a row of one int64 table ``T`` (treap fields,
then address, address-order links and a free flag), linked in address order
so a free finds its neighbours in O(1). Free blocks are also indexed for the
search: first and next fit keep them in a treap keyed by address with
subtree maxima of the size (``tracekit.sim.treap``); best fit in size classes
(``tracekit.sim.sizeclass``); worst fit in a treap keyed by (size, address).
Scalar state lives in the int64 array ``st`` so a replay can run in chunks.
"""

from __future__ import annotations

from numba import njit

from tracekit.sim import sizeclass, treap
from tracekit.sim.heap import (
    S_FIRST_OOM,
    S_OOM_FREE,
    S_OOM_LARGEST,
    S_OOM_LIVE,
    S_OOM_RESERVED,
    S_OOM_ROUNDED,
    S_OOMS,
    S_PEAK_EXTENT,
    S_PEAK_LIVE,
)
from tracekit.sim.treap import K1, K2, MX, NFIELDS, SZ

ADDR, PREV, NEXT, ISFREE = NFIELDS, NFIELDS + 1, NFIELDS + 2, NFIELDS + 3
WIDTH = NFIELDS + 4
# Slots of the kernel's scalar state.
ROOT, RECYCLE, NEXT_ID, ROVER, LIVE, CAP, FIT, STOPPED, GROWS = range(9)


@njit(cache=True, inline="always")
def _key(T, x, by_size):  # pragma: no cover - compiled
    if by_size:
        T[x, K1] = T[x, SZ]
        T[x, K2] = T[x, ADDR]
    else:
        T[x, K1] = T[x, ADDR]
        T[x, K2] = 0


@njit(cache=True, inline="always")
def _is_top(T, st, x):  # pragma: no cover - compiled
    """Whether x is the free block running to the end of an unbounded heap."""
    return st[GROWS] == 1 and T[x, ADDR] + T[x, SZ] == st[CAP]


@njit(cache=True)
def _find(T, st, stack, roots, bm, r):  # pragma: no cover - compiled
    fit = st[FIT]
    root = st[ROOT]
    if fit == 0:
        return treap.first_fit(T, root, r)
    if fit == 1:
        return sizeclass.best(T, roots, bm, r)
    if fit == 3:
        top = treap.rightmost(T, root)
        if top < 0 or T[top, SZ] < r:
            return -1
        if _is_top(T, st, top):  # an unbounded heap grows only when nothing else fits
            p = treap.predecessor(T, top)
            if p < 0 or T[p, SZ] < r:
                return top
            top = p
        return treap.lower_bound(T, root, T[top, SZ], 0)
    # next fit: start at the free block containing the rover, else the next one up
    start = st[ROVER]
    y = treap.floor(T, root, start, 0)
    if y >= 0 and T[y, ADDR] + T[y, SZ] > start:
        start = T[y, ADDR]
    x = treap.first_fit_from(T, root, start, r, stack)
    if x < 0 or _is_top(T, st, x):  # wrap around before growing the heap
        w = treap.first_fit(T, root, r)
        if w >= 0:
            x = w
    return x


@njit(cache=True)
def _new_node(T, st):  # pragma: no cover - compiled
    x = st[RECYCLE]
    if x >= 0:
        st[RECYCLE] = T[x, NEXT]
        return x
    x = st[NEXT_ID]
    st[NEXT_ID] = x + 1
    return x


@njit(cache=True)
def _drop_node(T, st, x):  # pragma: no cover - compiled
    T[x, NEXT] = st[RECYCLE]
    st[RECYCLE] = x


@njit(cache=True)
def _sized_add(T, st, roots, bm, x):  # pragma: no cover - compiled
    """Insert free block x into the by-size index (best fit: size classes; worst fit: one tree)."""
    _key(T, x, True)
    if st[FIT] == 1:
        sizeclass.add(T, roots, bm, x)
    else:
        st[ROOT] = treap.insert(T, st[ROOT], x, False)


@njit(cache=True)
def _sized_drop(T, st, roots, bm, x):  # pragma: no cover - compiled
    if st[FIT] == 1:
        sizeclass.drop(T, roots, bm, x)
    else:
        st[ROOT] = treap.remove(T, st[ROOT], x, False)


@njit(cache=True)
def _place(T, st, roots, bm, x, r):  # pragma: no cover - compiled
    """Take the low r bytes of free block x; return the node of the new used block."""
    by_size = st[FIT] == 1 or st[FIT] == 3
    a = T[x, ADDR]
    rest = T[x, SZ] - r
    if rest == 0:
        if by_size:
            _sized_drop(T, st, roots, bm, x)
        else:
            st[ROOT] = treap.remove(T, st[ROOT], x, True)
        T[x, ISFREE] = 0
        return x
    y = _new_node(T, st)
    T[y, ADDR] = a
    T[y, SZ] = r
    T[y, ISFREE] = 0
    p = T[x, PREV]
    T[y, PREV] = p
    T[y, NEXT] = x
    T[x, PREV] = y
    if p >= 0:
        T[p, NEXT] = y
    if by_size:
        _sized_drop(T, st, roots, bm, x)
        T[x, ADDR] = a + r
        T[x, SZ] = rest
        _sized_add(T, st, roots, bm, x)
    else:  # keyed by address: the rest keeps x's place in the order
        T[x, ADDR] = a + r
        treap.rekey(T, x, a + r, rest)
    return y


@njit(cache=True)
def _unlink(T, st, x):  # pragma: no cover - compiled
    """Remove node x from the address list and recycle it."""
    p = T[x, PREV]
    n = T[x, NEXT]
    if p >= 0:
        T[p, NEXT] = n
    if n >= 0:
        T[n, PREV] = p
    _drop_node(T, st, x)


@njit(cache=True)
def _release(T, st, roots, bm, x):  # pragma: no cover - compiled
    """Free used block x, coalescing with free address neighbours."""
    p = T[x, PREV]
    n = T[x, NEXT]
    pf = p >= 0 and T[p, ISFREE] == 1
    nf = n >= 0 and T[n, ISFREE] == 1
    if st[FIT] == 1 or st[FIT] == 3:  # keyed by size: merged blocks move in the order
        if pf:
            _sized_drop(T, st, roots, bm, p)
            T[x, ADDR] = T[p, ADDR]
            T[x, SZ] += T[p, SZ]
            _unlink(T, st, p)
        if nf:
            _sized_drop(T, st, roots, bm, n)
            T[x, SZ] += T[n, SZ]
            _unlink(T, st, n)
        T[x, ISFREE] = 1
        _sized_add(T, st, roots, bm, x)
        return
    # Keyed by address: a merged block keeps the place of its lowest free part.
    if pf:
        grown = T[p, SZ] + T[x, SZ]
        if nf:
            grown += T[n, SZ]
            st[ROOT] = treap.remove(T, st[ROOT], n, True)
            _unlink(T, st, n)
        _unlink(T, st, x)
        treap.rekey(T, p, T[p, ADDR], grown)
    elif nf:
        a = T[x, ADDR]
        grown = T[n, SZ] + T[x, SZ]
        _unlink(T, st, x)
        T[n, ADDR] = a
        treap.rekey(T, n, a, grown)
    else:
        T[x, ISFREE] = 1
        _key(T, x, False)
        st[ROOT] = treap.insert(T, st[ROOT], x, True)


@njit(cache=True)
def _largest(T, st, roots, bm):  # pragma: no cover - compiled
    if st[FIT] == 1:
        return sizeclass.largest(T, roots, bm)
    root = st[ROOT]
    if root < 0:
        return 0
    if st[FIT] == 3:  # keyed by size: the last node
        return T[treap.rightmost(T, root), SZ]
    return T[root, MX]


@njit(cache=True)
def run_chunk(T, st, stack, roots, bm, kind, size, mate, rounded, node_of, addr_out, status, stats,
              lo, hi, cont):
    # pragma: no cover - compiled
    for i in range(lo, hi):
        k = kind[i]
        if k == 0:
            r = max(((size[i] + 511) >> 9) << 9, 512)  # 512-byte units, at least one
            rounded[i] = r
            x = _find(T, st, stack, roots, bm, r)
            if x < 0:
                status[i] = 2  # Status.OOM
                stats[S_OOMS] += 1
                if stats[S_FIRST_OOM] < 0:
                    stats[S_FIRST_OOM] = i
                    stats[S_OOM_FREE] = st[CAP] - st[LIVE]
                    stats[S_OOM_LARGEST] = _largest(T, st, roots, bm)
                    stats[S_OOM_LIVE] = st[LIVE]
                    stats[S_OOM_RESERVED] = st[CAP]
                    stats[S_OOM_ROUNDED] = r
                if not cont:
                    st[STOPPED] = 1
                    return
                continue
            y = _place(T, st, roots, bm, x, r)
            a = T[y, ADDR]
            node_of[i] = y
            addr_out[i] = a
            status[i] = 1  # Status.DONE
            st[ROVER] = a + r
            st[LIVE] += r
            if st[LIVE] > stats[S_PEAK_LIVE]:
                stats[S_PEAK_LIVE] = st[LIVE]
            if a + r > stats[S_PEAK_EXTENT]:
                stats[S_PEAK_EXTENT] = a + r
        elif k == 1:
            m = mate[i]
            if m < 0:
                continue
            if status[m] != 1:
                status[i] = 3  # Status.SKIPPED: its malloc failed
                continue
            y = node_of[m]
            st[LIVE] -= T[y, SZ]
            _release(T, st, roots, bm, y)
            status[i] = 1


@njit(cache=True)
def seed(T, st, roots, bm, cap):  # pragma: no cover - compiled
    """Node 0: the whole heap [0, cap), free (no node for an empty heap)."""
    st[ROOT] = -1
    if cap <= 0:
        return
    T[0, SZ] = cap
    T[0, ADDR] = 0
    T[0, PREV] = -1
    T[0, NEXT] = -1
    T[0, ISFREE] = 1
    if st[FIT] == 1 or st[FIT] == 3:
        _sized_add(T, st, roots, bm, 0)
    else:
        _key(T, 0, False)
        st[ROOT] = treap.insert(T, -1, 0, True)
