"""What is live at a given moment: blocks by call-site, segments and their free gaps.

``pool_state_at(events, mate, k)`` reconstructs, with NumPy masks over the
whole trace (no per-event Python), the blocks and segments that are live
just before event ``k`` runs (for an ``oom`` row: the moment the request
failed); ``k = len(events)`` gives the state at the end of the trace, which
is where leaks are read. ``by_site`` groups live blocks by call-site:
``bytes`` = Σ rounded sizes, ``blocks`` = count, largest first; ``by_label`` groups them by
the label of their stack (``tracekit.trace.callsite``: the user's line and the library line
that made the request), so stacks that reach one request line from one user line are one row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from tracekit.trace.callsite import CallSites
from tracekit.trace.events import Events
from tracekit.trace.schema import Op


class SiteBytesJSON(TypedDict):
    """``site``: the call-site's label; ``user_site``/``request_site``: its user frame and the
    frame that made the request (``path:line:function``, null where the stack has none)."""

    site: str | None
    user_site: str | None
    request_site: str | None
    bytes: int
    blocks: int


@dataclass(frozen=True)
class SiteBytes:
    """Live bytes held by one call-site (``site`` None = no call-site recorded)."""

    site: str | None
    bytes: int
    blocks: int
    user_site: str | None = None
    request_site: str | None = None

    def as_json(self) -> SiteBytesJSON:
        return SiteBytesJSON(site=self.site, user_site=self.user_site, request_site=self.request_site,
                             bytes=self.bytes, blocks=self.blocks)

    def to_dict(self) -> dict[str, Any]:
        """``as_json`` as a plain dict, for callers that hold it as one."""
        return dict(self.as_json())


@dataclass(frozen=True, eq=False)
class PoolState:
    """Blocks and segments live just before an event (parallel NumPy arrays).

    ``block_*``: addr (uint64), size (rounded bytes, uint64), requested
    (uint64), stream (uint64), site (int32 index into ``sites``, -1 none),
    index (int64, the malloc's event index). ``seg_*``: addr, size, stream.
    """

    block_addr: np.ndarray
    block_size: np.ndarray
    block_requested: np.ndarray
    block_stream: np.ndarray
    block_site: np.ndarray
    block_index: np.ndarray
    seg_addr: np.ndarray
    seg_size: np.ndarray
    seg_stream: np.ndarray
    sites: tuple[str, ...]

    def gaps(self, merge_adjacent: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Free gaps inside segments: (segment index, gap start, gap length), address order.

        A gap is a maximal run of a segment's addresses not covered by a block.
        With ``merge_adjacent`` (expandable segments) touching segments of one
        stream count as one, indexed by the first of them. Vectorized: the
        complement of the union of blocks, clipped to each segment.
        """
        seg, s0, s1 = self._extents(merge_adjacent)
        # The union of all blocks as disjoint covered runs, then the holes between them.
        order = np.argsort(self.block_addr, kind="stable")
        b0 = self.block_addr[order].astype(np.int64)
        b1 = np.maximum.accumulate(b0 + self.block_size[order].astype(np.int64)) if len(b0) else b0
        new_run = np.r_[True, b0[1:] > b1[:-1]] if len(b0) else np.zeros(0, np.bool_)
        run_start = b0[new_run]
        run_end = b1[np.r_[np.flatnonzero(new_run)[1:] - 1, len(b0) - 1]] if len(b0) else b0
        lo = np.iinfo(np.int64).min
        hole0 = np.r_[lo, run_end]
        hole1 = np.r_[run_start, np.iinfo(np.int64).max]
        # Holes overlapping each segment [s0, s1): a contiguous index range per segment.
        a = np.searchsorted(hole1, s0, side="right")
        b = np.searchsorted(hole0, s1, side="left")
        count = np.maximum(b - a, 0)
        owner = np.repeat(np.arange(len(seg)), count)
        hole = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(a, count)
        g0 = np.maximum(hole0[hole], s0[owner])
        g1 = np.minimum(hole1[hole], s1[owner])
        keep = g1 > g0
        return seg[owner][keep], g0[keep], (g1 - g0)[keep]

    def _extents(self, merge_adjacent: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(first segment index, start, end) of each extent, address order (int64)."""
        order = np.argsort(self.seg_addr, kind="stable")
        s0 = self.seg_addr[order].astype(np.int64)
        s1 = s0 + self.seg_size[order].astype(np.int64)
        first = np.ones(len(order), np.bool_)
        if merge_adjacent and len(order) > 1:
            stream = self.seg_stream[order]
            first[1:] = (s0[1:] != s1[:-1]) | (stream[1:] != stream[:-1])
        heads = np.flatnonzero(first)
        tails = np.r_[heads[1:] - 1, len(order) - 1] if len(heads) else heads
        return order[heads].astype(np.int64), s0[heads], s1[tails]


def _live_mask(ev: Events, mate: np.ndarray, k: int, opener: Op) -> np.ndarray:
    idx = np.arange(len(ev))
    return (ev.op == opener) & (idx < k) & ((mate < 0) | (mate >= k))


def pool_state_at(ev: Events, mate: np.ndarray, k: int) -> PoolState:
    """Blocks and segments live just before event ``k`` (``k = len(ev)``: at the end)."""
    b = np.flatnonzero(_live_mask(ev, mate, k, Op.MALLOC))
    s = np.flatnonzero(_live_mask(ev, mate, k, Op.SEGMENT_ALLOC))
    return PoolState(
        block_addr=ev.addr[b], block_size=ev.rounded[b], block_requested=ev.size[b],
        block_stream=ev.stream[b], block_site=ev.site[b], block_index=b.astype(np.int64),
        seg_addr=ev.addr[s], seg_size=ev.size[s], seg_stream=ev.stream[s], sites=ev.sites,
    )


def by_site(site: np.ndarray, nbytes: np.ndarray, sites: tuple[str, ...], top: int | None = None
            ) -> tuple[SiteBytes, ...]:
    """Group blocks by call-site: Σ bytes and count per site, most bytes first."""
    return tuple(SiteBytes(sites[k] if k >= 0 else None, b, n) for k, b, n in _grouped(site, nbytes, top))


def by_label(stack: np.ndarray, nbytes: np.ndarray, cs: CallSites, top: int | None = None
             ) -> tuple[SiteBytes, ...]:
    """Group blocks by the label of their stack (``stack``: stack ids, -1 none), most bytes first."""
    return tuple(SiteBytes(cs.name(k), b, n, cs.user_site(k), cs.request_site(k))
                 for k, b, n in _grouped(cs.of_events(stack), nbytes, top))


def _grouped(site: np.ndarray, nbytes: np.ndarray, top: int | None) -> list[tuple[int, int, int]]:
    """(key, Σ bytes, count) per distinct key (-1: none), most bytes first, exact integer sums."""
    if len(site) == 0:
        return []
    key = site.astype(np.int64) + 1  # -1 (no site) -> bucket 0
    order = np.argsort(key, kind="stable")
    k = key[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    total = np.add.reduceat(nbytes[order].astype(np.uint64), starts)  # exact integer sums
    count = np.diff(np.r_[starts, len(k)])
    keys = k[starts]
    rank = np.lexsort((keys, -total.astype(np.float64)))
    if top is not None:
        rank = rank[:top]
    return [(int(keys[r]) - 1, int(total[r]), int(count[r])) for r in rank]


def never_freed(ev: Events, mate: np.ndarray) -> np.ndarray:
    """Indices of the mallocs never freed (still live at the end of the trace)."""
    return np.flatnonzero((ev.op == Op.MALLOC) & (mate < 0))


def leaks(ev: Events, mate: np.ndarray, stack: np.ndarray, cs: CallSites, top: int | None = 20
          ) -> tuple[SiteBytes, ...]:
    """Blocks still live at the end of the trace (malloc never freed), by call-site label;
    ``stack``: each event's stack id."""
    b = never_freed(ev, mate)
    return by_label(stack[b], ev.rounded[b], cs, top)
