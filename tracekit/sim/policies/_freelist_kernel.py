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

from tracekit.compiled import plain
from tracekit.sim import sizeclass, treap
from tracekit.sim.codes import Fit, Kind, Stat, Status
from tracekit.sim.codes import HeapSlot as H
from tracekit.sim.codes import ListField as F
from tracekit.sim.prepare import stand_in
from tracekit.sim.treap import K1, K2, K3, MX, SZ

AT = 0  # the treap's columns start the row


@plain(inline="always")
def _key(T, x, by_size):  # pragma: no cover - compiled
    T[x, K3] = 0
    if by_size:
        T[x, K1] = T[x, SZ]
        T[x, K2] = T[x, F.ADDR]
    else:
        T[x, K1] = T[x, F.ADDR]
        T[x, K2] = 0


@plain(inline="always")
def _is_top(T, st, x):  # pragma: no cover - compiled
    """Whether x is the free block running to the end of an unbounded heap."""
    return st[H.GROWS] == 1 and T[x, F.ADDR] + T[x, SZ] == st[H.CAP]


@plain
def _find(T, st, stack, roots, bm, r):  # pragma: no cover - compiled
    fit = st[H.FIT]
    root = st[H.ROOT]
    if fit == Fit.FIRST:
        return treap.first_fit(T, root, r, AT)
    if fit == Fit.BEST:
        return sizeclass.best(T, roots, bm, r)
    if fit == Fit.WORST:
        top = treap.rightmost(T, root, AT)
        if top < 0 or T[top, SZ] < r:
            return -1
        if _is_top(T, st, top):  # an unbounded heap grows only when nothing else fits
            p = treap.predecessor(T, top, AT)
            if p < 0 or T[p, SZ] < r:
                return top
            top = p
        return treap.lower_bound(T, root, T[top, SZ], 0, 0, AT)
    # next fit: start at the free block containing the rover, else the next one up
    start = st[H.ROVER]
    y = treap.floor(T, root, start, 0, 0, AT)
    if y >= 0 and T[y, F.ADDR] + T[y, SZ] > start:
        start = T[y, F.ADDR]
    x = treap.first_fit_from(T, root, start, r, stack, AT)
    if x < 0 or _is_top(T, st, x):  # wrap around before growing the heap
        w = treap.first_fit(T, root, r, AT)
        if w >= 0:
            x = w
    return x


@plain
def _new_node(T, st):  # pragma: no cover - compiled
    x = st[H.RECYCLE]
    if x >= 0:
        st[H.RECYCLE] = T[x, F.NEXT]
        return x
    x = st[H.NEXT_ID]
    st[H.NEXT_ID] = x + 1
    return x


@plain
def _drop_node(T, st, x):  # pragma: no cover - compiled
    T[x, F.NEXT] = st[H.RECYCLE]
    st[H.RECYCLE] = x


@plain
def _sized_add(T, st, roots, bm, x):  # pragma: no cover - compiled
    """Insert free block x into the by-size index (best fit: size classes; worst fit: one tree)."""
    _key(T, x, True)
    if st[H.FIT] == Fit.BEST:
        sizeclass.add(T, roots, bm, x)
    else:
        st[H.ROOT] = treap.insert(T, st[H.ROOT], x, False, AT)


@plain
def _sized_drop(T, st, roots, bm, x):  # pragma: no cover - compiled
    if st[H.FIT] == Fit.BEST:
        sizeclass.drop(T, roots, bm, x)
    else:
        st[H.ROOT] = treap.remove(T, st[H.ROOT], x, False, AT)


@plain
def _place(T, st, roots, bm, x, r):  # pragma: no cover - compiled
    """Take the low r bytes of free block x; return the node of the new used block."""
    by_size = st[H.FIT] == Fit.BEST or st[H.FIT] == Fit.WORST
    a = T[x, F.ADDR]
    rest = T[x, SZ] - r
    if rest == 0:
        if by_size:
            _sized_drop(T, st, roots, bm, x)
        else:
            st[H.ROOT] = treap.remove(T, st[H.ROOT], x, True, AT)
        T[x, F.ISFREE] = 0
        return x
    y = _new_node(T, st)
    T[y, F.ADDR] = a
    T[y, SZ] = r
    T[y, F.ISFREE] = 0
    p = T[x, F.PREV]
    T[y, F.PREV] = p
    T[y, F.NEXT] = x
    T[x, F.PREV] = y
    if p >= 0:
        T[p, F.NEXT] = y
    if by_size:
        _sized_drop(T, st, roots, bm, x)
        T[x, F.ADDR] = a + r
        T[x, SZ] = rest
        _sized_add(T, st, roots, bm, x)
    else:  # keyed by address: the rest keeps x's place in the order
        T[x, F.ADDR] = a + r
        treap.rekey(T, x, a + r, rest, AT)
    return y


@plain
def _unlink(T, st, x):  # pragma: no cover - compiled
    """Remove node x from the address list and recycle it."""
    p = T[x, F.PREV]
    n = T[x, F.NEXT]
    if p >= 0:
        T[p, F.NEXT] = n
    if n >= 0:
        T[n, F.PREV] = p
    _drop_node(T, st, x)


@plain
def _release(T, st, roots, bm, x):  # pragma: no cover - compiled
    """Free used block x, coalescing with free address neighbours; the free block it is now in."""
    p = T[x, F.PREV]
    n = T[x, F.NEXT]
    pf = p >= 0 and T[p, F.ISFREE] == 1
    nf = n >= 0 and T[n, F.ISFREE] == 1
    if st[H.FIT] == Fit.BEST or st[H.FIT] == Fit.WORST:  # keyed by size: merged blocks move in the order
        if pf:
            _sized_drop(T, st, roots, bm, p)
            T[x, F.ADDR] = T[p, F.ADDR]
            T[x, SZ] += T[p, SZ]
            _unlink(T, st, p)
        if nf:
            _sized_drop(T, st, roots, bm, n)
            T[x, SZ] += T[n, SZ]
            _unlink(T, st, n)
        T[x, F.ISFREE] = 1
        _sized_add(T, st, roots, bm, x)
        return x
    # Keyed by address: a merged block keeps the place of its lowest free part.
    if pf:
        grown = T[p, SZ] + T[x, SZ]
        if nf:
            grown += T[n, SZ]
            st[H.ROOT] = treap.remove(T, st[H.ROOT], n, True, AT)
            _unlink(T, st, n)
        _unlink(T, st, x)
        treap.rekey(T, p, T[p, F.ADDR], grown, AT)
        return p
    if nf:
        a = T[x, F.ADDR]
        grown = T[n, SZ] + T[x, SZ]
        _unlink(T, st, x)
        T[n, F.ADDR] = a
        treap.rekey(T, n, a, grown, AT)
        return n
    T[x, F.ISFREE] = 1
    _key(T, x, False)
    st[H.ROOT] = treap.insert(T, st[H.ROOT], x, True, AT)
    return x


@plain(inline="always")
def _freed(T, st, roots, bm, x, says):  # pragma: no cover - compiled
    """Free used block x (``_release``); with ``says``, keeping where the free block at the heap's
    end starts."""
    m = _release(T, st, roots, bm, x)
    if says and T[m, F.ADDR] + T[m, SZ] == st[H.CAP]:
        st[H.TOP] = T[m, F.ADDR]


@plain(inline="always")
def _asks(st, c):  # pragma: no cover - compiled
    """The unbounded heap's placement is made alike only from capacity c up."""
    if c > st[H.ASKED]:
        st[H.ASKED] = c


@plain(inline="always")
def _same_from(st, c):  # pragma: no cover - compiled
    """Every capacity from c up makes this placement alike (and the unbounded heap does)."""
    if c > st[H.PASSED]:
        st[H.PASSED] = c
    _asks(st, c)


@plain(inline="always")
def _same_below(st, c):  # pragma: no cover - compiled
    """No capacity from c up makes this placement alike."""
    if st[H.REFUSED] == 0 or c < st[H.REFUSED]:
        st[H.REFUSED] = c


@plain(inline="always")
def _note_choice(T, st, roots, bm, x, r):  # pragma: no cover - compiled
    """First and best fit: at which capacities this request of r bytes gets block x (-1: none)
    as it does here. The capacity enters only through the free block at the heap's end (the top,
    from ``st[H.TOP]`` to the capacity; none when TOP is CAP), the last of all blocks by address:

    - first fit takes the top only when no block below it fits: alike at every capacity where
      the top fits, top + r up;
    - best fit takes the smallest block that fits, ties to the lowest address (never the top):
      a block x below the top is taken alike where the top is at least its size (top + size up)
      or does not fit (below top + r); the top, from top + r up to below top + the size of the
      next fitting block (none in an unbounded heap: it grows only when nothing else fits);
    - none fits: alike below top + r.

    ``ASKED`` takes every capacity from which a placement is the unbounded heap's (so it exceeds
    the capacity of a run that placed any request otherwise: no such run is taken as unbounded)."""
    cap, top = st[H.CAP], st[H.TOP]
    if x < 0:
        _same_below(st, top + r)
        _asks(st, top + r)
        return
    if T[x, F.ADDR] == top and top < cap:  # the top itself
        _same_from(st, top + r)
        if st[H.FIT] == Fit.BEST and st[H.GROWS] == 0:
            y = sizeclass.after(T, roots, bm, x)
            if y >= 0:  # a block below fits too: from top + its size the top is not the smallest
                _same_below(st, top + T[y, SZ])
                _asks(st, top + T[y, SZ])
        return
    if st[H.FIT] == Fit.BEST:
        size = T[x, SZ]
        if cap - top >= size:
            _same_from(st, top + size)
        else:  # the top did not fit: it would be taken from top + r up to below top + size
            _same_below(st, top + r)
            _asks(st, top + size)


@plain
def _largest(T, st, roots, bm):  # pragma: no cover - compiled
    if st[H.FIT] == Fit.BEST:
        return sizeclass.largest(T, roots, bm)
    root = st[H.ROOT]
    if root < 0:
        return 0
    if st[H.FIT] == Fit.WORST:  # keyed by size: the last node
        return T[treap.rightmost(T, root, AT), SZ]
    return T[root, MX]


@plain(nogil=True)  # nogil: beside the read (head_start), settings in threads (advise)
def run_chunk(T, st, stack, roots, bm, kind, size, mate, rep, holder, rounded, node_of, addr_out, status,
              stats, lo, hi, cont):
    # pragma: no cover - compiled
    says = st[H.SAYS] == 1  # where the run is alike (_note_choice), the top kept (``SimConfig.alike``)
    outputs = addr_out.shape[0] > 0  # the per-event addresses and roundings (``SimConfig.per_event``)
    for i in range(lo, hi):
        k = kind[i]
        h = stand_in(kind, rep, holder, i)
        if h >= 0:  # a served handled attempt stands in for this malloc: its block
            node_of[i] = node_of[h]
            if outputs:
                addr_out[i] = addr_out[h]
        if h != -1:
            status[i] = Status.DONE if h >= 0 else Status.TRIED
            continue
        if k == Kind.ALLOC or k == Kind.TRY:
            r = max(((size[i] + 511) >> 9) << 9, 512)  # 512-byte units, at least one
            if outputs:
                rounded[i] = r
            x = _find(T, st, stack, roots, bm, r)
            if says:
                _note_choice(T, st, roots, bm, x, r)
            if x < 0 and k == Kind.TRY:  # the program survived this failure: it goes on
                status[i] = Status.OOM
                stats[Stat.HANDLED] += 1
                continue
            if x < 0:
                status[i] = Status.OOM
                stats[Stat.OOMS] += 1
                if stats[Stat.FIRST_OOM] < 0:
                    stats[Stat.FIRST_OOM] = i
                    stats[Stat.OOM_FREE] = st[H.CAP] - st[H.LIVE]
                    stats[Stat.OOM_LARGEST] = _largest(T, st, roots, bm)
                    stats[Stat.OOM_LIVE] = st[H.LIVE]
                    stats[Stat.OOM_RESERVED] = st[H.CAP]
                    stats[Stat.OOM_ROUNDED] = r
                if not cont:
                    st[H.STOPPED] = 1
                    return
                continue
            at_top = says and T[x, F.ADDR] == st[H.TOP]
            y = _place(T, st, roots, bm, x, r)
            a = T[y, F.ADDR]
            if at_top:  # the rest of the top is the top (none when it was all taken)
                st[H.TOP] = a + r if a + r < st[H.CAP] else st[H.CAP]
            if k == Kind.TRY and rep[i] < 0:  # served; nothing replaced it: released at once
                if a + r > stats[Stat.PEAK_EXTENT]:
                    stats[Stat.PEAK_EXTENT] = a + r
                st[H.ROVER] = a + r
                _freed(T, st, roots, bm, y, says)
                status[i] = Status.TRIED
                continue
            node_of[i] = y
            if outputs:
                addr_out[i] = a
            status[i] = Status.DONE
            if k == Kind.TRY:  # served: it lives in place of the retry that replaced it
                status[i] = Status.TRIED
                holder[rep[i]] = i
            st[H.ROVER] = a + r
            st[H.LIVE] += r
            if st[H.LIVE] > stats[Stat.PEAK_LIVE]:
                stats[Stat.PEAK_LIVE] = st[H.LIVE]
            if a + r > stats[Stat.PEAK_EXTENT]:
                stats[Stat.PEAK_EXTENT] = a + r
        elif k == Kind.FREE:
            m = mate[i]
            if m < 0:
                continue
            if status[m] != Status.DONE:
                status[i] = Status.SKIPPED  # its malloc failed
                continue
            y = node_of[m]
            st[H.LIVE] -= T[y, SZ]
            _freed(T, st, roots, bm, y, says)
            status[i] = Status.DONE


@plain
def seed(T, st, roots, bm, cap):  # pragma: no cover - compiled
    """Node 0: the whole heap [0, cap), free (no node for an empty heap)."""
    st[H.ROOT] = -1
    st[H.TOP] = 0 if cap > 0 else cap
    if cap <= 0:
        return
    T[0, SZ] = cap
    T[0, F.ADDR] = 0
    T[0, F.PREV] = -1
    T[0, F.NEXT] = -1
    T[0, F.ISFREE] = 1
    if st[H.FIT] == Fit.BEST or st[H.FIT] == Fit.WORST:
        _sized_add(T, st, roots, bm, 0)
    else:
        _key(T, 0, False)
        st[H.ROOT] = treap.insert(T, -1, 0, True, AT)
