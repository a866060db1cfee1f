"""Event-level consistency: pair each free with its malloc, and flag the rest.

A ``free`` pairs with the most recent ``malloc`` of the same (device, addr);
a ``segment_free`` likewise with its ``segment_alloc``. Real recordings can
hold events that break this (the recorder started late, an event was lost),
so those are warnings, not errors: a free of an address that is not live, a
double free, and a malloc of an address that is already live. Readers drop
them and report a count and the first seq of each kind (``Severity.SKIPPED``);
the block/segment checks of ``tracekit.trace.containment`` keep their events
(``Severity.WARNING``). The pairing is one
compiled pass with an open-addressing hash table keyed by (device, addr):
O(n), no per-event Python objects. ``mate[i]`` is the index of the event paired with event i
(the free of a malloc and the other way round), or -1.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from numba import njit

from tracekit.trace.schema import Op


class IssueKind(IntEnum):
    FREE_NOT_LIVE = 0
    DOUBLE_FREE = 1
    MALLOC_LIVE = 2
    SEGMENT_FREE_NOT_LIVE = 3
    SEGMENT_DOUBLE_FREE = 4
    SEGMENT_ALLOC_LIVE = 5
    FREE_OTHER_DEVICE = 6
    BLOCK_OTHER_DEVICE = 7
    BLOCK_OUTSIDE_SEGMENT = 8
    SEGMENT_FREE_UNDER_BLOCKS = 9
    ROUNDED_BELOW_SIZE = 10

    @property
    def describe(self) -> str:
        return _DESCRIBE[self]

    @property
    def severity(self) -> Severity:
        return Severity.WARNING if self >= IssueKind.BLOCK_OUTSIDE_SEGMENT else Severity.SKIPPED


class Severity(IntEnum):
    """SKIPPED: readers drop the events; WARNING: they keep them (the data may be real)."""

    SKIPPED = 0
    WARNING = 1


_DESCRIBE = {
    IssueKind.FREE_NOT_LIVE: "free of an address that is not live",
    IssueKind.DOUBLE_FREE: "double free",
    IssueKind.MALLOC_LIVE: "malloc of an address that is already live",
    IssueKind.SEGMENT_FREE_NOT_LIVE: "segment_free of a segment that is not live",
    IssueKind.SEGMENT_DOUBLE_FREE: "segment freed twice",
    IssueKind.SEGMENT_ALLOC_LIVE: "segment_alloc of an address that is already live",
    IssueKind.FREE_OTHER_DEVICE: "free on another device than its malloc (devices contradict each other)",
    IssueKind.BLOCK_OTHER_DEVICE: "malloc inside a segment of another device, none of its own (and its free)",
    IssueKind.BLOCK_OUTSIDE_SEGMENT: "malloc outside any live segment of its device",
    IssueKind.SEGMENT_FREE_UNDER_BLOCKS: "segment_free while blocks inside it are live",
    IssueKind.ROUNDED_BELOW_SIZE: "malloc with rounded below size",
}


@dataclass(frozen=True)
class EventIssue:
    """One kind of inconsistency: how many events had it, and the first one's seq."""

    kind: IssueKind
    count: int
    first_seq: int

    def describe(self) -> str:
        return f"{self.count} x {self.kind.describe} (first at seq {self.first_seq})"


@dataclass(frozen=True, eq=False)
class Pairing:
    keep: np.ndarray  # bool per event: False for the events readers skip
    mate: np.ndarray  # int64 per event (original indexing), -1 if unpaired
    issues: tuple[EventIssue, ...]


# The pairing table: open addressing over (key, tag) slots, linear probing. A tag is
# device · N_CLASSES + class (``BLOCK`` or ``SEGMENT``), so blocks and segments of one address
# are separate keys; a slot's value is the index of the live malloc / segment_alloc, or FREED.
EMPTY = -1  # the tag of an unused slot
FREED = -1  # the value of a key whose last allocation was freed (a second free is a double free)
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
    h = ((addr >> np.uint64(ADDR_SHIFT)) * np.uint64(GOLDEN)) >> np.uint64(HASH_SHIFT)
    j = np.int64(h & np.uint64(mask))
    while tags[j] != EMPTY and (keys[j] != addr or tags[j] != tag):
        j = (j + 1) & mask
    return j


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
def _scan(op, addr, device, keep, mate, counts, first):  # pragma: no cover - compiled
    """One pass in event order over the pairing table: an allocation claims its key (value := i),
    a free pairs with the value (mate both ways, value := FREED); the rest is flagged."""
    cap = INITIAL_SLOTS
    keys = np.zeros(cap, np.uint64)
    tags = np.full(cap, EMPTY, np.int32)
    vals = np.zeros(cap, np.int64)
    used = 0
    for i in range(op.shape[0]):
        o = op[i]
        if o == Op.OOM:
            continue
        seg = o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE
        tag = np.int32(device[i]) * N_CLASSES + (SEGMENT if seg else BLOCK)
        j = _slot(keys, tags, addr[i], tag, cap - 1)
        seen = tags[j] != EMPTY
        live = seen and vals[j] != FREED
        if o == Op.MALLOC or o == Op.SEGMENT_ALLOC:
            if live:
                _flag(keep, counts, first, _live_again(seg), i)
                continue
            if not seen:
                keys[j] = addr[i]
                tags[j] = tag
                used += 1
            vals[j] = i
            if _too_full(used, cap):
                keys, tags, vals = _grow(keys, tags, vals)
                cap = keys.shape[0]
        elif live:  # free / segment_free of a live allocation
            mate[i] = vals[j]
            mate[vals[j]] = i
            vals[j] = FREED
        else:
            _flag(keep, counts, first, _unpaired_free(seg, seen), i)


def pair_events(op: np.ndarray, addr: np.ndarray, device: np.ndarray, seq: np.ndarray,
                size: np.ndarray | None = None) -> Pairing:
    """Pair frees with mallocs (and segment frees with segment allocs); with ``size``, also
    flag blocks that lie in another device's segments only."""
    n = len(op)
    keep = np.ones(n, dtype=np.bool_)
    mate = np.full(n, -1, dtype=np.int64)
    counts = np.zeros(len(IssueKind), dtype=np.int64)
    first = np.full(len(IssueKind), -1, dtype=np.int64)
    _scan(op, addr, device, keep, mate, counts, first)
    _other_device(op, addr, device, keep, counts, first)
    if size is not None:
        _block_other_device(op, addr, size, device, keep, mate, counts, first)
    issues = tuple(
        EventIssue(IssueKind(k), int(counts[k]), int(seq[first[k]]))
        for k in range(len(IssueKind))
        if counts[k]
    )
    return Pairing(keep=keep, mate=mate, issues=issues)


# Beyond this many devices the cross-device check is skipped (it costs one pass per device).
MAX_DEVICES_CHECKED = 16
U64_MAX = np.uint64(np.iinfo(np.uint64).max)


def _other_device(op: np.ndarray, addr: np.ndarray, device: np.ndarray, keep: np.ndarray,
                  counts: np.ndarray, first: np.ndarray) -> None:
    """Among the skipped block frees, count those whose address a malloc on another device
    returned: the trace's devices contradict each other (e.g. a recorder that took the device
    from the wrong source). Counted apart from, and also within, the frees that are not live."""
    lost = np.flatnonzero(~keep & (op == Op.FREE))
    devs = np.unique(device[lost]) if len(lost) else device[:0]
    if not len(lost) or len(np.unique(device)) > MAX_DEVICES_CHECKED:
        return
    hit = np.zeros(len(lost), np.bool_)
    for d in devs:
        mine = device[lost] == d
        elsewhere = addr[(op == Op.MALLOC) & (device != d)]
        hit[mine] = np.isin(addr[lost[mine]], elsewhere)
    k = IssueKind.FREE_OTHER_DEVICE
    counts[k] = int(hit.sum())
    if counts[k]:
        first[k] = lost[np.argmax(hit)]


def _covered(lo: np.ndarray, size: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Per address in ``at``: inside the union of the ranges [lo, lo + size) (lifetimes ignored)."""
    hi = lo + np.minimum(size, U64_MAX - lo)  # saturating: no range wraps past 2^64
    order = np.argsort(lo, kind="stable")
    lo, reach = lo[order], np.maximum.accumulate(hi[order])
    j = np.searchsorted(lo, at, side="right") - 1
    return (j >= 0) & (at < reach[np.maximum(j, 0)])


def _block_other_device(op: np.ndarray, addr: np.ndarray, size: np.ndarray, device: np.ndarray,
                        keep: np.ndarray, mate: np.ndarray, counts: np.ndarray, first: np.ndarray) -> None:
    """Skip mallocs (and their frees) whose address lies in a segment of another device and in
    none of their own: the devices of the trace contradict each other. Address ranges of a device
    are taken over the whole trace, so a block is flagged only where no own segment ever held it."""
    seg = np.flatnonzero(op == Op.SEGMENT_ALLOC)
    devs = np.unique(device[seg])
    if len(devs) < 2 or len(devs) > MAX_DEVICES_CHECKED:
        return
    blk = np.flatnonzero((op == Op.MALLOC) & keep)
    cov = np.stack([_covered(addr[seg[device[seg] == d]], size[seg[device[seg] == d]], addr[blk])
                    for d in devs])
    own = np.searchsorted(devs, device[blk])
    has_own = np.isin(device[blk], devs)
    mine = np.zeros(len(blk), np.bool_)
    mine[has_own] = cov[own[has_own], np.flatnonzero(has_own)]
    bad = blk[~mine & cov.any(axis=0)]
    k = IssueKind.BLOCK_OTHER_DEVICE
    counts[k] = len(bad)
    if not len(bad):
        return
    first[k] = bad[0]
    keep[bad] = False
    freed = mate[bad][mate[bad] >= 0]
    keep[freed] = False
    mate[freed] = -1
    mate[bad] = -1


def remap_mate(mate: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``mate`` re-indexed for the events that survive ``keep`` (dropped partners -> -1)."""
    new_index = np.cumsum(keep, dtype=np.int64) - 1
    new_index[~keep] = -1
    kept = mate[keep]
    out = np.where(kept >= 0, new_index[np.maximum(kept, 0)], -1)
    return out.astype(np.int64)
