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

import numpy as np

from tracekit.trace.issues import EventIssue, IssueKind, Severity
from tracekit.trace.schema import Op

__all__ = ["EventIssue", "IssueKind", "Pairing", "Severity", "pair_events", "remap_mate"]


@dataclass(frozen=True, eq=False)
class Pairing:
    keep: np.ndarray  # bool per event: False for the events readers skip
    mate: np.ndarray  # int64 per event (original indexing), -1 if unpaired
    issues: tuple[EventIssue, ...]


def pair_events(op: np.ndarray, addr: np.ndarray, device: np.ndarray, seq: np.ndarray,
                size: np.ndarray | None = None) -> Pairing:
    """Pair frees with mallocs (and segment frees with segment allocs); with ``size``, also
    flag blocks that lie in another device's segments only."""
    n = len(op)
    keep = np.ones(n, dtype=np.bool_)
    mate = np.full(n, -1, dtype=np.int64)
    counts = np.zeros(len(IssueKind), dtype=np.int64)
    first = np.full(len(IssueKind), -1, dtype=np.int64)
    from tracekit.trace._kernels import scan  # numba: loaded here, once the events are read

    scan(op, addr, device, keep, mate, counts, first)
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
