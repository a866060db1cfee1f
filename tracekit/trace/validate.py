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

from tracekit.trace.issues import EventIssue, Found, IssueKind, Severity
from tracekit.trace.schema import Op

__all__ = ["EventIssue", "Found", "IssueKind", "Pairing", "Severity", "checked_pairing", "finish_pairing",
           "pair_and_check", "pair_events", "pass_tables", "read_only", "remap_mate"]


@dataclass(frozen=True, eq=False)
class Pairing:
    keep: np.ndarray  # bool per event: False for the events readers skip
    mate: np.ndarray  # int64 per event (original indexing), -1 if unpaired
    issues: tuple[EventIssue, ...]


def pair_events(op: np.ndarray, addr: np.ndarray, device: np.ndarray, seq: np.ndarray,
                size: np.ndarray | None = None) -> Pairing:
    """Pair frees with mallocs (and segment frees with segment allocs); with ``size``, also
    flag blocks that lie in another device's segments only."""
    keep, mate, counts, first = pass_tables(len(op))
    from tracekit.trace.readpass import read_pass  # C where built, else numba: loaded here, once read

    none = np.zeros(0, np.uint64)  # not read without the checks; of the types the checks take
    op_, seq_, t_ns_, addr_, size_, device_ = read_only(op, seq, none.view(np.int64), addr, none, device)
    read_pass(op_, seq_, t_ns_, addr_, size_, none, device_, keep, mate, counts, first, np.zeros(0, np.int64),
              np.uint64(0), np.int64(0), False)
    return finish_pairing(op, addr, device, seq, size, keep, mate, counts, first)


def pair_and_check(op: np.ndarray, seq: np.ndarray, t_ns: np.ndarray, addr: np.ndarray, size: np.ndarray,
                   rounded: np.ndarray, device: np.ndarray, max_request: int,
                   limit: int) -> tuple[Pairing, np.ndarray]:
    """``pair_events`` (with ``size``) and the reader's per-event checks in one compiled pass
    (``_kernels.read_pass``): the pairing, and per ``Found`` the index of the first event with that
    fault (-1: none). Fills an unknown ``rounded`` (0) of a request with its ``size``, in place, so
    ``rounded`` must be writable. The totals and ranges in ``found`` are of the events the pass
    kept; where the cross-device check drops more (``IssueKind.BLOCK_OTHER_DEVICE``), they are -1
    and left to ``totals.check_totals`` and ``check_ranges`` over the final pairing."""
    keep, mate, counts, first = pass_tables(len(op))
    found = np.full(len(Found), -1, np.int64)
    from tracekit.trace.readpass import read_pass  # C where built, else numba: loaded here, once read

    op_, seq_, t_ns_, addr_, size_, device_ = read_only(op, seq, t_ns, addr, size, device)
    read_pass(op_, seq_, t_ns_, addr_, size_, rounded, device_, keep, mate, counts, first, found,
              np.uint64(max_request), np.int64(limit), True)
    return checked_pairing(op, addr, device, seq, size, keep, mate, counts, first, found)


def checked_pairing(op: np.ndarray, addr: np.ndarray, device: np.ndarray, seq: np.ndarray, size: np.ndarray,
                    keep: np.ndarray, mate: np.ndarray, counts: np.ndarray, first: np.ndarray,
                    found: np.ndarray) -> tuple[Pairing, np.ndarray]:
    """``pair_and_check``'s answer once its pass (``_kernels.read_pass``) has seen every event."""
    pairing = finish_pairing(op, addr, device, seq, size, keep, mate, counts, first)
    if counts[IssueKind.BLOCK_OTHER_DEVICE]:
        found[[Found.OVER_LIVE, Found.OVER_RESERVED, Found.PAST_END]] = -1
    return pairing, found


def read_only(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    """Read-only views: numba compiles a kernel once per writability, and Events' columns (what
    the other callers pass) are read-only, so every caller reaches the one compiled pass."""
    out = []
    for a in arrays:
        if a.flags.writeable:
            a = a.view()
            a.flags.writeable = False
        out.append(a)
    return tuple(out)


def pass_tables(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """keep and mate (uninitialized: ``read_pass`` writes each event's first), and the counts and
    first index of each ``IssueKind`` (none)."""
    return (np.empty(n, dtype=np.bool_), np.empty(n, dtype=np.int64), np.zeros(len(IssueKind), np.int64),
            np.full(len(IssueKind), -1, dtype=np.int64))


def finish_pairing(op: np.ndarray, addr: np.ndarray, device: np.ndarray, seq: np.ndarray,
                   size: np.ndarray | None, keep: np.ndarray, mate: np.ndarray, counts: np.ndarray,
                   first: np.ndarray) -> Pairing:
    """The cross-device checks after the scan, and the issues found."""
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
