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

from tracekit.trace.issues import Found, IssueKind
from tracekit.trace.schema import Op

# The pairing table: open addressing over (key, tag) slots, linear probing. A tag is
# device · N_CLASSES + class (``BLOCK`` or ``SEGMENT``), so blocks and segments of one address
# are separate keys; a slot's value is the index of the live malloc / segment_alloc. A free
# empties its slot (the run after it shifted back, ``_remove``): the table holds the live
# allocations only, a few thousand where a trace has millions of blocks at addresses of their own
# (10M events: 1.32 s of pairing with every address kept, 16M slots; 0.3 s so), so it stays in the
# cache. Whether a free of no live allocation frees an address allocated before (a double free) or
# one never allocated is decided after the pass, for those frees alone (``_classify_unpaired``).
EMPTY = -1  # the tag of an unused slot
BLOCK, SEGMENT, N_CLASSES = 0, 1, 2
INITIAL_SLOTS = 1 << 12  # a power of two: the slot index is the hash masked by slots − 1
# Fibonacci hashing: h = ((addr >> ADDR_SHIFT) · ⌊2^64/φ⌋ mod 2^64) >> HASH_SHIFT. Device
# allocations are at least 256-byte aligned, so the low ADDR_SHIFT bits carry nothing; the
# product's high bits mix best, so the low HASH_SHIFT are dropped.
GOLDEN = 11400714819323198485  # ⌊2^64 / φ⌋
ADDR_SHIFT = 8
HASH_SHIFT = 20


@njit(cache=True)
def _slot(keys, tags, addr, tag, mask):  # pragma: no cover - compiled
    """The slot of (addr, tag): where it is, or the empty slot where it goes (linear probing
    from h & mask, h the Fibonacci hash of the address)."""
    j = _home(addr, mask)
    while tags[j] != EMPTY and (keys[j] != addr or tags[j] != tag):
        j = (j + 1) & mask
    return j


@njit(cache=True)
def _home(addr, mask):  # pragma: no cover - compiled
    """The first slot of an address's probe run."""
    h = ((addr >> np.uint64(ADDR_SHIFT)) * np.uint64(GOLDEN)) >> np.uint64(HASH_SHIFT)
    return np.int64(h & np.uint64(mask))


@njit(cache=True)
def _remove(keys, tags, vals, j, mask):  # pragma: no cover - compiled
    """Empty slot j, moving back each later slot of its probe run that may take the place (linear
    probing's deletion without tombstones: every key stays reachable from its home slot)."""
    k = j
    while True:
        k = (k + 1) & mask
        if tags[k] == EMPTY:
            break
        home = _home(keys[k], mask)
        if (j <= k and (home <= j or home > k)) or (j > k and home <= j and home > k):
            keys[j] = keys[k]
            tags[j] = tags[k]
            vals[j] = vals[k]
            j = k
    tags[j] = EMPTY


@njit(cache=True)
def _too_full(used, slots):  # pragma: no cover - compiled
    """Load factor used / slots above 1/2: probe runs would grow long."""
    return used * 2 > slots


@njit(cache=True)
def _grow(keys, tags, vals):  # pragma: no cover - compiled
    """The table rehashed into twice the slots."""
    cap = keys.shape[0] * 2
    nk = np.zeros(cap, np.uint64)
    nt = np.full(cap, EMPTY, np.int32)
    nv = np.zeros(cap, np.int64)
    for j in range(keys.shape[0]):
        if tags[j] != EMPTY:
            k = _slot(nk, nt, keys[j], tags[j], cap - 1)
            nk[k] = keys[j]
            nt[k] = tags[j]
            nv[k] = vals[j]
    return nk, nt, nv


@njit(cache=True)
def _flag(keep, counts, first, kind, i):  # pragma: no cover - compiled
    """Event i has issue ``kind``: readers skip it; count it, and keep the first such event."""
    keep[i] = False
    counts[kind] += 1
    if first[kind] < 0:
        first[kind] = i


@njit(cache=True)
def _live_again(seg):  # pragma: no cover - compiled
    """The issue of an allocation at an address that is still live."""
    return IssueKind.SEGMENT_ALLOC_LIVE if seg else IssueKind.MALLOC_LIVE


@njit(cache=True)
def _unpaired_free(seg, seen):  # pragma: no cover - compiled
    """The issue of a free with no live allocation: a second free when the key was seen, else a
    free of an address never allocated."""
    if seg:
        return IssueKind.SEGMENT_DOUBLE_FREE if seen else IssueKind.SEGMENT_FREE_NOT_LIVE
    return IssueKind.DOUBLE_FREE if seen else IssueKind.FREE_NOT_LIVE


@njit(cache=True)
def _new_table():  # pragma: no cover - compiled
    """An empty pairing table of INITIAL_SLOTS slots: (keys, tags, values)."""
    return (np.zeros(INITIAL_SLOTS, np.uint64), np.full(INITIAL_SLOTS, EMPTY, np.int32),
            np.zeros(INITIAL_SLOTS, np.int64))


@njit(cache=True)
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
    keys, tags, vals = _new_table()
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
        tag = np.int32(device[i]) * N_CLASSES + (SEGMENT if seg else BLOCK)
        j = _slot(keys, tags, addr[i], tag, cap - 1)
        live = tags[j] != EMPTY
        if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
            if live:
                _flag(keep, counts, first, _live_again(seg), i)
                continue
            keys[j] = addr[i]
            tags[j] = tag
            vals[j] = i
            used += 1
            if _too_full(used, cap):
                keys, tags, vals = _grow(keys, tags, vals)
                cap = keys.shape[0]
        elif live:  # free / segment_free of a live allocation
            mate[i] = vals[j]
            mate[vals[j]] = i
            _remove(keys, tags, vals, j, cap - 1)
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
    keys, tags, vals = _new_table()
    cap = keys.shape[0]
    used = 0
    for i in range(op.shape[0]):  # the unpaired frees' addresses, value 0: not allocated yet
        o = op[i]
        if keep[i] or not (o == Op.FREE or o == Op.SEGMENT_FREE):
            continue
        tag = np.int32(device[i]) * N_CLASSES + (SEGMENT if o == Op.SEGMENT_FREE else BLOCK)
        j = _slot(keys, tags, addr[i], tag, cap - 1)
        if tags[j] == EMPTY:
            keys[j] = addr[i]
            tags[j] = tag
            vals[j] = 0
            used += 1
            if _too_full(used, cap):
                keys, tags, vals = _grow(keys, tags, vals)
                cap = keys.shape[0]
    for i in range(op.shape[0]):
        o = op[i]
        if o == Op.OOM:
            continue
        seg = o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE
        tag = np.int32(device[i]) * N_CLASSES + (SEGMENT if seg else BLOCK)
        j = _slot(keys, tags, addr[i], tag, cap - 1)
        if tags[j] == EMPTY:
            continue  # not the address of an unpaired free
        if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
            vals[j] = 1  # allocated from here on
        elif not keep[i]:
            _flag(keep, counts, first, _unpaired_free(seg, vals[j] == 1), i)


@njit(cache=True)
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
