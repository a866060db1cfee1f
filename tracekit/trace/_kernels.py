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
from tracekit.trace.issues import Found, IssueKind, PassState
from tracekit.trace.live_table import EMPTY, grow, new_table, remove, slot, tag_of, too_full
from tracekit.trace.schema import Op

# The pairing table is ``tracekit.trace.live_table``: the live allocations only (a free empties
# its slot: 10M events whose blocks each have an address of their own paired in 0.3 s, not 1.32 s
# with every address kept in 16M slots). Whether a free of no live allocation frees an address
# allocated before (a double free) or one never allocated is decided after the pass, for those
# frees alone (``classify_unpaired``).


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


def read_pass(op, seq, t_ns, addr, size, rounded, device, keep, mate, counts, first, found,
              max_request, limit, checks):
    """One pass in event order over the pairing table: an allocation claims its key (value := i),
    a free pairs with the value (mate both ways) and empties the slot; the rest is flagged (a free
    of no live allocation by ``classify_unpaired`` after the pass); ``keep`` (all
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

    The events go through ``pass_until_full``, a ``plain`` kernel (``tracekit.compiled``: with
    reference counts, the table's helpers called for every event took more than half of the pass,
    0.30-0.36 s of 10M events against 0.14 s without, 2-core machine); it stops where the table
    must grow, and goes on from there once it has grown.
    """
    run = ReadPass(keep, mate, counts, first, found, max_request, limit, checks)
    run.run(op, seq, t_ns, addr, size, rounded, device, op.shape[0])
    run.finish(op, addr, device)


class ReadPass:
    """``read_pass`` over events handed over in order: ``run`` up to an event (the rows read so
    far), then, once every event is in, ``finish``. Its arguments are ``read_pass``'s, the
    arrays of the whole file (``run`` reads the rows before ``end`` only)."""

    def __init__(self, keep, mate, counts, first, found, max_request, limit, checks):
        self.keys, self.tags, self.vals = new_table()
        self.state = np.zeros(len(PassState), np.int64)
        self.state[PassState.COUNTING] = 1 if checks else 0
        self.keep, self.mate, self.counts, self.first, self.found = keep, mate, counts, first, found
        self.max_request, self.limit, self.checks = max_request, limit, checks

    @property
    def at(self) -> int:
        """The events passed so far."""
        return int(self.state[PassState.AT])

    def run(self, op, seq, t_ns, addr, size, rounded, device, end) -> None:
        """The events up to ``end`` (exclusive)."""
        while pass_until_full(self.keys, self.tags, self.vals, self.state, op, seq, t_ns, addr, size, rounded,
                              device, self.keep, self.mate, self.counts, self.first, self.found,
                              self.max_request, self.limit, self.checks, np.int64(end)):
            self.keys, self.tags, self.vals = grow(self.keys, self.tags, self.vals)

    def finish(self, op, addr, device) -> None:
        """After the last event: the frees of no live allocation counted by kind."""
        if self.state[PassState.UNPAIRED]:
            classify_unpaired(op, addr, device, self.keep, self.counts, self.first)


@plain(nogil=True)  # nogil: run beside the read, in the reader's pairing thread (``trace.ahead``)
def pass_until_full(keys, tags, vals, state, op, seq, t_ns, addr, size, rounded, device, keep, mate,
                    counts, first, found, max_request, limit, checks, end):  # pragma: no cover - compiled
    """``read_pass``'s events from ``state[AT]`` on, until ``end``, or until an allocation left
    the table too full: True where it stopped for the table to grow (``state`` holds where and
    what it had), False at the end."""
    cap = keys.shape[0]
    used = state[PassState.USED]
    unpaired = state[PassState.UNPAIRED]
    live_bytes = state[PassState.LIVE_BYTES]  # int64 throughout: uint64 + int64 would make float64
    reserved = state[PassState.RESERVED]
    counting = state[PassState.COUNTING] != 0
    top = np.uint64(0xFFFFFFFFFFFFFFFF)
    full = False
    i = state[PassState.AT]
    while i < end and not full:
        at = i
        i += 1
        keep[at] = True  # keep and mate come uninitialized: written here first (each page touched once)
        mate[at] = -1  # (a malloc's mate is written later, by its free: after this)
        o = op[at]
        if checks:
            if at > 0 and seq[at] <= seq[at - 1]:
                _found(found, Found.SEQ_BACK, at)
            if at > 0 and t_ns[at] < t_ns[at - 1]:
                _found(found, Found.T_BACK, at)
            if o == Op.MALLOC or o == Op.OOM:
                if size[at] >= max_request:
                    _found(found, Found.BIG_REQUEST, at)
                if rounded[at] == 0:
                    rounded[at] = size[at]
        if o == Op.OOM:
            continue
        seg = o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE
        tag = tag_of(device[at], seg)
        j = slot(keys, tags, addr[at], tag, cap - 1)
        live = tags[j] != EMPTY
        if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
            if live:
                _flag(keep, counts, first, _live_again(seg), at)
                continue
            keys[j] = addr[at]
            tags[j] = tag
            vals[j] = at
            used += 1
            full = too_full(used, cap)  # grown before the next event (by read_pass)
        elif live:  # free / segment_free of a live allocation
            mate[at] = vals[j]
            mate[vals[j]] = at
            remove(keys, tags, vals, j, cap - 1)
            used -= 1
        else:
            keep[at] = False  # counted once the pass knows every allocation before it
            unpaired += 1
            continue
        if not checks:
            continue
        length = np.uint64(0)  # of the kept event at: the totals and its range
        if o == Op.MALLOC:
            length = rounded[at]
            live_bytes += np.int64(length)
        elif o == Op.SEGMENT_ALLOC:
            length = size[at]
            reserved += np.int64(length)
        elif o == Op.FREE:
            live_bytes -= np.int64(rounded[mate[at]])
        else:
            reserved -= np.int64(size[mate[at]])
        if counting and (live_bytes >= limit or reserved >= limit):
            _found(found, Found.OVER_LIVE if live_bytes >= limit else Found.OVER_RESERVED, at)
            counting = False
        if length > 0 and length - np.uint64(1) > top - addr[at]:
            _found(found, Found.PAST_END, at)
    state[PassState.AT] = i
    state[PassState.USED] = used
    state[PassState.UNPAIRED] = unpaired
    state[PassState.LIVE_BYTES] = live_bytes
    state[PassState.RESERVED] = reserved
    state[PassState.COUNTING] = 1 if counting else 0
    return full


@njit(cache=True)
def classify_unpaired(op, addr, device, keep, counts, first):  # pragma: no cover - compiled
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
