"""What is live at a given moment: blocks by call-site, segments and their free gaps.

``pool_state_at(events, mate, k)`` reconstructs, with NumPy masks over the
whole trace (no per-event Python), the blocks and segments that are live
just before event ``k`` runs (for an ``oom`` row: the moment the request
failed); ``k = len(events)`` gives the state at the end of the trace, which
is where leaks are read. ``by_site`` groups live blocks by call-site:
``bytes`` = Σ rounded sizes, ``blocks`` = count, largest first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.trace.events import Events
from tracekit.trace.schema import Op


@dataclass(frozen=True)
class SiteBytes:
    """Live bytes held by one call-site (``site`` None = no call-site recorded)."""

    site: str | None
    bytes: int
    blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {"site": self.site, "bytes": self.bytes, "blocks": self.blocks}


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
        stream count as one, indexed by the first of them.
        """
        seg_i: list[int] = []
        starts: list[int] = []
        lens: list[int] = []
        order = np.argsort(self.block_addr, kind="stable")
        b_addr = self.block_addr[order].astype(np.int64)
        b_end = b_addr + self.block_size[order].astype(np.int64)
        for s, s0, s1 in self._extents(merge_adjacent):
            a = int(np.searchsorted(b_end, s0, side="right"))
            b = int(np.searchsorted(b_addr, s1, side="left"))
            cur = s0
            for k in range(a, b):
                if b_addr[k] > cur:
                    seg_i.append(s)
                    starts.append(cur)
                    lens.append(int(b_addr[k]) - cur)
                cur = max(cur, int(b_end[k]))
            if s1 > cur:
                seg_i.append(s)
                starts.append(cur)
                lens.append(s1 - cur)
        return (np.array(seg_i, np.int64), np.array(starts, np.int64), np.array(lens, np.int64))

    def _extents(self, merge_adjacent: bool) -> list[tuple[int, int, int]]:
        out: list[tuple[int, int, int]] = []
        for s in np.argsort(self.seg_addr, kind="stable"):
            s0 = int(self.seg_addr[s])
            s1 = s0 + int(self.seg_size[s])
            if (merge_adjacent and out and out[-1][2] == s0
                    and self.seg_stream[out[-1][0]] == self.seg_stream[s]):
                out[-1] = (out[-1][0], out[-1][1], s1)
            else:
                out.append((int(s), s0, s1))
        return out

    def largest_free_block(self, stream: int | None = None) -> int:
        """Longest gap, over all segments or only those of ``stream``."""
        seg, _, length = self.gaps()
        if stream is not None:
            length = length[self.seg_stream[seg] == stream]
        return int(length.max()) if len(length) else 0


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
    if len(site) == 0:
        return ()
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
    out = [
        SiteBytes(sites[keys[r] - 1] if keys[r] > 0 else None, int(total[r]), int(count[r]))
        for r in rank
    ]
    return tuple(out)


def leaks(ev: Events, mate: np.ndarray, top: int | None = 20) -> tuple[SiteBytes, ...]:
    """Blocks still live at the end of the trace (malloc never freed), by call-site."""
    b = np.flatnonzero((ev.op == Op.MALLOC) & (mate < 0))
    return by_site(ev.site[b], ev.rounded[b], ev.sites, top)
