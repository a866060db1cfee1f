"""The reader's compiled kernels: the malloc/free pairing scan (``tracekit.trace.validate``), the
running totals' first step past the limit (``tracekit.trace.totals``), and the reader's one pass
that does both with every per-event check (``read_pass``).

Apart from those modules so that reading a trace starts before numba is imported (issue 45: a verb
reaches its first read within 0.3 s of the process's start); they import this module at the first
pairing, which needs numba anyway.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.trace.issues import Found, IssueKind
from tracekit.trace.live_table import EMPTY, grow, new_table, remove, slot, tag_of, too_full
from tracekit.trace.schema import Op

# The pairing table is ``tracekit.trace.live_table``: the live allocations only (a free empties
# its slot: 10M events whose blocks each have an address of their own paired in 0.3 s, not 1.32 s
# with every address kept in 16M slots). Whether a free of no live allocation frees an address
# allocated before (a double free) or one never allocated is decided after the pass, for those
# frees alone (``_classify_unpaired``).


@plain
def _flag(keep, counts, first, kind, i):  # pragma: no cover - compiled
    """Event i has issue ``kind``: readers skip it; count it, and keep the first such event."""
    keep[i] = False
    counts[kind] += 1
    if first[kind] < 0:
        first[kind] = i


@plain
def _live_again(seg):  # pragma: no cover - compiled
    """The issue of an allocation at an address that is still live."""
    return IssueKind.SEGMENT_ALLOC_LIVE if seg else IssueKind.MALLOC_LIVE


@plain
def _unpaired_free(seg, seen):  # pragma: no cover - compiled
    """The issue of a free with no live allocation: a second free when the key was seen, else a
    free of an address never allocated."""
    if seg:
        return IssueKind.SEGMENT_DOUBLE_FREE if seen else IssueKind.SEGMENT_FREE_NOT_LIVE
    return IssueKind.DOUBLE_FREE if seen else IssueKind.FREE_NOT_LIVE


@plain
def _found(found, what, i):  # pragma: no cover - compiled
    """The first event with fault ``what`` (a ``Found``) is i, unless one was found before."""
    if found[what] < 0:
        found[what] = i


@njit(cache=True)
def read_pass(op, seq, t_ns, addr, size, rounded, device, keep, mate, counts, first, found,
              max_request, limit, checks):  # pragma: no cover - compiled
    """One pass in event order over the pairing table: an allocation claims its key (value := i),
    a free pairs with the value (mate both ways) and empties the slot; the rest is flagged (a free
    of no live allocation by ``_classify_unpaired`` after the pass); ``keep`` (all
    True) and ``mate`` (all -1) are initialized here, event by event. With
    ``checks``, also every per-event check of the reader, each fault's first event index written
    to ``found`` (indexed by ``Found``; -1: none); without, ``t_ns``, ``size``, ``rounded`` and
    ``found`` are not read (empty arrays will do).

    ``seq`` strictly increasing (``SEQ_BACK``) and ``t_ns`` never decreasing (``T_BACK``): the later
    row of the first pair out of order. A request (malloc, oom) of ``max_request`` bytes or more
    (``BIG_REQUEST``); its ``rounded`` of 0 (unknown) becomes its ``size`` (bytes), in place. Of the
    events the pairing keeps: live bytes (the rounded sizes of live blocks) or reserved bytes (the
    sizes of live segments) reaching ``limit`` (``OVER_LIVE``, ``OVER_RESERVED``: as ``first_over``),
    a block ``[addr, addr + rounded)`` or segment ``[addr, addr + size)`` past 2^64 (``PAST_END``).
    """
    keys, tags, vals = new_table()
    cap = keys.shape[0]
    used = 0
    unpaired = 0  # frees of no live allocation: counted by kind after the pass
    live_bytes = np.int64(0)  # int64 throughout: uint64 + int64 would make float64 in numba
    reserved = np.int64(0)
    counting = checks  # the totals stop at their first step past the limit (exact up to it)
    top = np.uint64(0xFFFFFFFFFFFFFFFF)
    for i in range(op.shape[0]):
        keep[i] = True  # keep and mate come uninitialized: written here first (each page touched once)
        mate[i] = -1  # (a malloc's mate is written later, by its free: after this)
        o = op[i]
        if checks:
            if i > 0 and seq[i] <= seq[i - 1]:
                _found(found, Found.SEQ_BACK, i)
            if i > 0 and t_ns[i] < t_ns[i - 1]:
                _found(found, Found.T_BACK, i)
            if o == Op.MALLOC or o == Op.OOM:
                if size[i] >= max_request:
                    _found(found, Found.BIG_REQUEST, i)
                if rounded[i] == 0:
                    rounded[i] = size[i]
        if o == Op.OOM:
            continue
        seg = o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE
        tag = tag_of(device[i], seg)
        j = slot(keys, tags, addr[i], tag, cap - 1)
        live = tags[j] != EMPTY
        if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
            if live:
                _flag(keep, counts, first, _live_again(seg), i)
                continue
            keys[j] = addr[i]
            tags[j] = tag
            vals[j] = i
            used += 1
            if too_full(used, cap):
                keys, tags, vals = grow(keys, tags, vals)
                cap = keys.shape[0]
        elif live:  # free / segment_free of a live allocation
            mate[i] = vals[j]
            mate[vals[j]] = i
            remove(keys, tags, vals, j, cap - 1)
            used -= 1
        else:
            keep[i] = False  # counted once the pass knows every allocation before it
            unpaired += 1
            continue
        if not checks:
            continue
        length = np.uint64(0)  # of the kept event i: the totals and its range
        if o == Op.MALLOC:
            length = rounded[i]
            live_bytes += np.int64(length)
        elif o == Op.SEGMENT_ALLOC:
            length = size[i]
            reserved += np.int64(length)
        elif o == Op.FREE:
            live_bytes -= np.int64(rounded[mate[i]])
        else:
            reserved -= np.int64(size[mate[i]])
        if counting and (live_bytes >= limit or reserved >= limit):
            _found(found, Found.OVER_LIVE if live_bytes >= limit else Found.OVER_RESERVED, i)
            counting = False
        if length > 0 and length - np.uint64(1) > top - addr[i]:
            _found(found, Found.PAST_END, i)
    if unpaired:
        _classify_unpaired(op, addr, device, keep, counts, first)


@njit(cache=True)
def _classify_unpaired(op, addr, device, keep, counts, first):  # pragma: no cover - compiled
    """Count each free of no live allocation (dropped by the pass) as a double free where its
    address was allocated before it (on its device, of its class), else as a free of an address
    never allocated: a table of those frees' addresses, then one scan in event order that marks an
    address allocated from its first allocation on."""
    keys, tags, vals = new_table()
    cap = keys.shape[0]
    used = 0
    for i in range(op.shape[0]):  # the unpaired frees' addresses, value 0: not allocated yet
        o = op[i]
        if keep[i] or not (o == Op.FREE or o == Op.SEGMENT_FREE):
            continue
        tag = tag_of(device[i], o == Op.SEGMENT_FREE)
        j = slot(keys, tags, addr[i], tag, cap - 1)
        if tags[j] == EMPTY:
            keys[j] = addr[i]
            tags[j] = tag
            vals[j] = 0
            used += 1
            if too_full(used, cap):
                keys, tags, vals = grow(keys, tags, vals)
                cap = keys.shape[0]
    for i in range(op.shape[0]):
        o = op[i]
        if o == Op.OOM:
            continue
        seg = o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE
        tag = tag_of(device[i], seg)
        j = slot(keys, tags, addr[i], tag, cap - 1)
        if tags[j] == EMPTY:
            continue  # not the address of an unpaired free
        if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
            vals[j] = 1  # allocated from here on
        elif not keep[i]:
            _flag(keep, counts, first, _unpaired_free(seg, vals[j] == 1), i)


@plain
def first_over(op, rounded, size, mate, keep, limit):  # pragma: no cover - compiled
    """(index, 0 for live bytes / 1 for reserved) of the first event whose running sum reaches
    ``limit``, or (-1, -1)."""
    live = np.int64(0)  # int64 throughout: uint64 + int64 would make float64 in numba
    reserved = np.int64(0)
    for i in range(op.shape[0]):
        if not keep[i]:
            continue
        o = op[i]
        if o == Op.MALLOC:
            live += np.int64(rounded[i])
        elif o == Op.FREE and mate[i] >= 0:
            live -= np.int64(rounded[mate[i]])
        elif o == Op.SEGMENT_ALLOC:
            reserved += np.int64(size[i])
        elif o == Op.SEGMENT_FREE and mate[i] >= 0:
            reserved -= np.int64(size[mate[i]])
        else:
            continue
        if live >= limit:
            return i, 0
        if reserved >= limit:
            return i, 1
    return -1, -1
