"""Blocks against segments in pooled traces: warnings that keep the events.

A trace with segment rows says where its blocks live, so three things can contradict it: a malloc
whose block [addr, addr + rounded) lies in no segment of its device that is live at that moment
(``BLOCK_OUTSIDE_SEGMENT``); a segment_free while a block inside it is still live
(``SEGMENT_FREE_UNDER_BLOCKS``); a malloc whose ``rounded`` is below its ``size``
(``ROUNDED_BELOW_SIZE``). Each can come from a real recording (one that started late sees blocks of
segments it never saw allocated), so readers keep the events and report a count and the first seq.

A block lies inside one segment, except that a block may span adjacent grid cells of an expandable
segment (extra column ``expandable``): there its first and last byte must each lie in a live
expandable cell (cells between are not looked at). Only devices that have segment rows are checked,
and with an extra column ``pool`` only the pools of a device that have them.

Time is the row index. The segment that holds address a at row t is the live one among the
segments whose range contains a; at any moment live segments are disjoint, so it is found by
walking segment start addresses downwards from a (most blocks: one step), each step one NumPy
pass over the blocks still unresolved. For each start address its versions are ordered by the row
of their segment_alloc, so the version live at t is a binary search. A block not resolved after
``MAX_STEPS`` steps is taken as inside (a trace built to defeat the walk is not warned about).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.trace.schema import Op
from tracekit.trace.validate import EventIssue, IssueKind

MAX_STEPS = 32
_TOP = np.uint64((1 << 64) - 1)


def _end(lo: np.ndarray, size: np.ndarray) -> np.ndarray:
    """lo + size, saturating at 2^64 - 1 (no range wraps)."""
    return lo + np.minimum(size, _TOP - lo)


@dataclass(frozen=True, eq=False)
class _Segments:
    """Kept segment_alloc rows sorted by (device rank, start address, row); ``free`` is the row of
    the matching segment_free, or n if it never comes."""

    n: int
    starts: np.ndarray  # sorted distinct start addresses (uint64)
    group_key: np.ndarray  # per (device, start) group: device rank * (len(starts) + 1) + start rank + 1
    group_dev: np.ndarray  # device rank of each group
    reach: np.ndarray  # per group: highest end over the groups of its device up to it
    last: np.ndarray  # per group: its latest segment
    group: np.ndarray  # group of each segment
    alloc: np.ndarray  # row of each segment's segment_alloc
    when: np.ndarray  # group * (n + 1) + alloc row: sorted, so one search finds the version
    hi: np.ndarray
    free: np.ndarray
    expandable: np.ndarray

    @classmethod
    def build(cls, rows: np.ndarray, dev_rank: np.ndarray, addr: np.ndarray, size: np.ndarray,
              mate: np.ndarray, expandable: np.ndarray | None, n: int) -> _Segments:
        lo = addr[rows]
        starts = np.unique(lo)
        key = dev_rank.astype(np.int64) * (len(starts) + 1) + np.searchsorted(starts, lo) + 1
        order = np.lexsort((rows, key))
        key, rows, lo = key[order], rows[order], lo[order]
        group_key, first, group = np.unique(key, return_index=True, return_inverse=True)
        hi = _end(lo, size[rows])
        group_dev = group_key // (len(starts) + 1)
        # Running max of the end within each device: ranks offset per device so one accumulate
        # never carries a value across devices.
        ends, rank = np.unique(np.maximum.reduceat(hi, first), return_inverse=True)
        run = np.maximum.accumulate(group_dev * len(ends) + rank)
        free = np.where(mate[rows] >= 0, mate[rows], n)
        exp = expandable[rows] if expandable is not None else np.zeros(len(rows), np.bool_)
        return cls(n, starts, group_key, group_dev, ends[run - group_dev * len(ends)],
                   np.append(first[1:], len(rows)) - 1, group, rows,
                   group.astype(np.int64) * (n + 1) + rows, hi, free, exp)

    def holding(self, dev: np.ndarray, a: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Per query: the segment live at row t whose range holds address a on device rank dev;
        -1 if none, -2 if not resolved within MAX_STEPS."""
        g = self._starts_upto(a) - 1
        if self.group_dev[-1] != 0:  # several devices: groups are (device, start) pairs
            g = np.searchsorted(self.group_key, dev.astype(np.int64) * (len(self.starts) + 1) + g + 1,
                                side="right") - 1
        found, more = self._step(g, dev, a, t)
        todo = np.flatnonzero(more)
        for _ in range(MAX_STEPS - 1):
            if not len(todo):
                return found
            g[todo] -= 1
            found[todo], more = self._step(g[todo], dev[todo], a[todo], t[todo])
            todo = todo[more]
        found[todo] = -2
        return found

    def _starts_upto(self, a: np.ndarray) -> np.ndarray:
        """How many start addresses are <= a: ``searchsorted(starts, a, "right")``, but through a table
        of about 2^22 equal address buckets where no start falls inside the query's bucket (a binary
        search per block costs as much as the rest of the check)."""
        base, n_starts = self.starts[0], len(self.starts)
        span = int(self.reach.max()) - int(base)
        shift = max(span.bit_length() - 22, 0)
        buckets = (span >> shift) + 2
        if int(base) + (buckets << shift) >= 1 << 64:
            return np.searchsorted(self.starts, a, side="right")
        edges = base + (np.arange(buckets, dtype=np.uint64) << np.uint64(shift))
        upto = np.searchsorted(self.starts, edges, side="right")  # starts <= each bucket's first address
        b = np.minimum((a - base) >> np.uint64(shift), np.uint64(buckets - 2)).astype(np.int64)
        out = upto[b]
        out[a < base] = 0
        hard = np.flatnonzero((upto[b + 1] != out) & (a >= base) | (a >= edges[-1]))
        out[hard] = np.searchsorted(self.starts, a[hard], side="right")
        return np.minimum(out, n_starts)

    def _step(self, g: np.ndarray, dev: np.ndarray, a: np.ndarray,
              t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The version of group g live at row t and holding a (else -1), and where to walk on."""
        gc = np.maximum(g, 0)
        v = self.last[gc]  # mostly right: a start address is seldom reused
        old = np.flatnonzero(self.alloc[v] > t)
        if len(old):
            v[old] = np.searchsorted(self.when, gc[old] * (self.n + 1) + t[old], side="right") - 1
            v[old[(v[old] < 0) | (self.group[np.maximum(v[old], 0)] != gc[old])]] = -1
        vc = np.maximum(v, 0)
        ok = (v >= 0) & (self.free[vc] > t) & (self.hi[vc] > a) & (g >= 0)
        if self.group_dev[-1] != 0:  # several devices: groups are (device, start) pairs
            ok &= self.group_dev[gc] == dev
        miss = np.flatnonzero(~ok)
        on = np.zeros(len(g), np.bool_)  # below a group whose reach is <= a nothing holds a
        on[miss] = (g[miss] >= 0) & (self.reach[gc[miss]] > a[miss])
        if self.group_dev[-1] != 0:
            on[miss] &= self.group_dev[gc[miss]] == dev[miss]
        return np.where(ok, v, -1), on


def check_pool(op: np.ndarray, addr: np.ndarray, size: np.ndarray, rounded: np.ndarray,
               device: np.ndarray, keep: np.ndarray, mate: np.ndarray,
               expandable: np.ndarray | None, seq: np.ndarray,
               pool: np.ndarray | None = None) -> tuple[EventIssue, ...]:
    """The three inconsistencies among the kept rows (module docstring), first seq of each.
    With ``pool`` (the extra column, -1 where null) each (device, pool) is checked on its own."""
    n = len(op)
    malloc = (op == Op.MALLOC) & keep
    low = np.flatnonzero(malloc & (rounded < size))
    seg = np.flatnonzero((op == Op.SEGMENT_ALLOC) & keep)
    if not len(seg):
        return _issues(seq, ((IssueKind.ROUNDED_BELOW_SIZE, low),))
    if pool is None and device.min() == device.max():  # one device: no lookup over all rows
        blk = np.flatnonzero(malloc & (rounded > 0))
        seg_rank, dr = np.zeros(len(seg), np.int32), np.zeros(len(blk), np.int32)
    else:
        blk, seg_rank, dr = _domains(device, pool, malloc & (rounded > 0), seg)
    segs = _Segments.build(seg, seg_rank, addr, size, mate, expandable, n)
    a, r = addr[blk], rounded[blk]
    v = segs.holding(dr, a, blk)
    vc = np.maximum(v, 0)
    outside = v == -1
    cross = np.flatnonzero((v >= 0) & (r > segs.hi[vc] - a))  # hi > a where v >= 0
    w = segs.holding(dr[cross], a[cross] + np.minimum(r[cross] - np.uint64(1), _TOP - a[cross]), blk[cross])
    w[~segs.expandable[v[cross]]] = -1
    outside[cross[(w == -1) | ((w >= 0) & ~segs.expandable[np.maximum(w, 0)])]] = True
    # A segment freed while one of its blocks lives on: the block's free comes after it (or never).
    under = [_freed_under(segs, x, blk[rows], mate) for x, rows in ((v, slice(None)), (w, cross))]
    return _issues(seq, ((IssueKind.BLOCK_OUTSIDE_SEGMENT, blk[outside]),
                         (IssueKind.SEGMENT_FREE_UNDER_BLOCKS, np.unique(np.concatenate(under))),
                         (IssueKind.ROUNDED_BELOW_SIZE, low)))


def _domains(device: np.ndarray, pool: np.ndarray | None, blocks: np.ndarray,
             seg: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The blocks to check (rows of ``blocks`` in a domain with segments) and the domain rank of
    each segment and block. A domain is a device, or a (device, pool) pair: CuPy's stream-ordered
    pool has no segment rows and may share a device with pools that have them."""
    key = device.astype(np.int64)
    if pool is not None:  # device * 2^47 + pool: exact for pool ids below 2^46
        key = key * (1 << 47) + np.clip(pool, -1, (1 << 46) - 1)
    domains = np.unique(key[seg])
    blk = np.flatnonzero(blocks)
    rank = np.searchsorted(domains, key[blk])
    inside = domains[np.minimum(rank, len(domains) - 1)] == key[blk]
    blk, rank = blk[inside], rank[inside]
    return blk, np.searchsorted(domains, key[seg]), rank


def _freed_under(segs: _Segments, v: np.ndarray, rows: np.ndarray, mate: np.ndarray) -> np.ndarray:
    """Rows of the segment_frees of segments v that come before the free of block rows (or none)."""
    sf = segs.free[np.maximum(v, 0)]
    cand = np.flatnonzero((v >= 0) & (sf < segs.n))
    bf = mate[rows[cand]]
    return sf[cand][(bf < 0) | (bf > sf[cand])]


def _issues(seq: np.ndarray, found: tuple[tuple[IssueKind, np.ndarray], ...]) -> tuple[EventIssue, ...]:
    return tuple(EventIssue(kind, len(rows), int(seq[rows.min()])) for kind, rows in found if len(rows))
