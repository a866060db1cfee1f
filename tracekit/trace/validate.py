"""Event-level consistency: pair each free with its malloc, and flag the rest.

A ``free`` pairs with the most recent ``malloc`` of the same (device, addr);
a ``segment_free`` likewise with its ``segment_alloc``. Real recordings can
hold events that break this (the recorder started late, an event was lost),
so those are warnings, not errors: a free of an address that is not live, a
double free, and a malloc of an address that is already live. Readers drop
them and report a count and the first seq of each kind. The pairing is one
stable sort by address plus one compiled scan: O(n log n), no per-event
Python objects. ``mate[i]`` is the index of the event paired with event i
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

    @property
    def describe(self) -> str:
        return _DESCRIBE[self]


_DESCRIBE = {
    IssueKind.FREE_NOT_LIVE: "free of an address that is not live",
    IssueKind.DOUBLE_FREE: "double free",
    IssueKind.MALLOC_LIVE: "malloc of an address that is already live",
    IssueKind.SEGMENT_FREE_NOT_LIVE: "segment_free of a segment that is not live",
    IssueKind.SEGMENT_DOUBLE_FREE: "segment freed twice",
    IssueKind.SEGMENT_ALLOC_LIVE: "segment_alloc of an address that is already live",
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


@njit(cache=True)
def _scan(order, op, addr, device, keep, mate, counts, first):  # pragma: no cover - compiled
    # For each run of equal (device, addr) in sorted order, walk events in
    # time order with a live flag per class (0 = block, 1 = segment).
    n = order.shape[0]
    start = 0
    while start < n:
        a = addr[order[start]]
        d = device[order[start]]
        end = start
        while end < n and addr[order[end]] == a and device[order[end]] == d:
            end += 1
        live0 = -1
        live1 = -1
        freed0 = False
        freed1 = False
        for k in range(start, end):
            i = order[k]
            o = op[i]
            if o == 0 or o == 2:  # malloc / segment_alloc
                c = 0 if o == 0 else 1
                live = live0 if c == 0 else live1
                if live >= 0:
                    keep[i] = False
                    kind = 2 + 3 * c
                    counts[kind] += 1
                    if first[kind] < 0:
                        first[kind] = i
                elif c == 0:
                    live0 = i
                else:
                    live1 = i
            elif o == 1 or o == 3:  # free / segment_free
                c = 0 if o == 1 else 1
                live = live0 if c == 0 else live1
                freed = freed0 if c == 0 else freed1
                if live < 0:
                    keep[i] = False
                    kind = (1 if freed else 0) + 3 * c
                    counts[kind] += 1
                    if first[kind] < 0:
                        first[kind] = i
                else:
                    mate[i] = live
                    mate[live] = i
                    if c == 0:
                        live0 = -1
                        freed0 = True
                    else:
                        live1 = -1
                        freed1 = True
        start = end


def pair_events(op: np.ndarray, addr: np.ndarray, device: np.ndarray, seq: np.ndarray) -> Pairing:
    """Pair frees with mallocs (and segment frees with segment allocs)."""
    n = len(op)
    keep = np.ones(n, dtype=np.bool_)
    mate = np.full(n, -1, dtype=np.int64)
    idx = np.flatnonzero(op != Op.OOM)
    dev = device[idx]
    if len(dev) and np.any(dev != dev[0]):
        order = idx[np.lexsort((addr[idx], dev))]
    else:
        order = idx[np.argsort(addr[idx], kind="stable")]
    counts = np.zeros(len(IssueKind), dtype=np.int64)
    first = np.full(len(IssueKind), -1, dtype=np.int64)
    _scan(order, op, addr, device, keep, mate, counts, first)
    issues = tuple(
        EventIssue(IssueKind(k), int(counts[k]), int(seq[first[k]]))
        for k in range(len(IssueKind))
        if counts[k]
    )
    return Pairing(keep=keep, mate=mate, issues=issues)


def remap_mate(mate: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``mate`` re-indexed for the events that survive ``keep`` (dropped partners -> -1)."""
    new_index = np.cumsum(keep, dtype=np.int64) - 1
    new_index[~keep] = -1
    kept = mate[keep]
    out = np.where(kept >= 0, new_index[np.maximum(kept, 0)], -1)
    return out.astype(np.int64)
