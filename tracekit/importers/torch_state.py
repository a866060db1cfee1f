"""The allocator state before a snapshot's first history entry, and the expandable-segment grid.

PyTorch keeps only the most recent ``max_entries`` history entries, so the
history can start mid-run. The state before its first entry is the final state
(the snapshot's ``segments`` and their ``blocks``) with the history undone
backwards, as PyTorch's own viewer does. Undoing needs no replay: an address
whose first block event in the history is a ``free_completed`` (not an
``alloc``) held a live block at the start, and a block live at the end whose
address never appears in the history was live all along. Segments follow the
same rule with ``segment_alloc`` / ``segment_free``.

Expandable segments are mapped and unmapped in ranges that need not match
(one unmap can cover several maps or part of one). To keep v1's pairing (a
``segment_free`` pairs with the ``segment_alloc`` of the same address), every
mapped range is cut on one grid per device: the sorted set of all start and
end addresses of every map, unmap and final mapped range. Each grid cell is
mapped and unmapped whole, so each cell becomes one segment whose rows pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tracekit.errors import InputError
from tracekit.importers.torch_columns import (
    ALLOC,
    FREE_COMPLETED,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    SEGMENT_MAP,
    SEGMENT_UNMAP,
    History,
    SiteTable,
)

if TYPE_CHECKING:
    from tracekit.importers.torch_stacks import StackBuilder


@dataclass(frozen=True, eq=False)
class FinalState:
    """A device's segments and live blocks at the end of the snapshot, as columns."""

    seg_addr: np.ndarray
    seg_size: np.ndarray
    seg_stream: np.ndarray
    seg_expandable: np.ndarray  # bool
    seg_site: np.ndarray
    seg_stack: np.ndarray  # raw stack keys (StackBuilder)
    blk_addr: np.ndarray
    blk_size: np.ndarray  # the block's bytes (rounded, exact)
    blk_req: np.ndarray  # the request that made it
    blk_stream: np.ndarray
    blk_site: np.ndarray
    blk_stack: np.ndarray


@dataclass(frozen=True, eq=False)
class Rows:
    """Rows to emit as columns (op is a v1 op code as int8)."""

    op: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    rounded: np.ndarray
    stream: np.ndarray
    site: np.ndarray
    stack: np.ndarray  # raw stack keys (StackBuilder), -1 none
    expandable: np.ndarray


LIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")


def final_state(segments: list[Any], device: int, table: SiteTable, stacks: StackBuilder) -> FinalState:
    """Columns of ``segments`` (all devices) restricted to ``device``."""
    sa, ss, st, sx, sf, sk = [], [], [], [], [], []
    ba, bs, br, bt, bf, bk = [], [], [], [], [], []
    for seg in segments:
        if not isinstance(seg, dict) or int(seg.get("device", 0) or 0) != device:
            continue
        addr, stream = int(seg.get("address", 0)), int(seg.get("stream", 0) or 0)
        blocks = seg.get("blocks") or []
        total = seg.get("total_size")
        if total is None:
            total = sum(int(b.get("size", 0)) for b in blocks)
        sa.append(addr)
        ss.append(int(total))
        st.append(stream)
        sx.append(bool(seg.get("is_expandable", False)))
        sf.append(table.site_of(seg.get("frames")))
        sk.append(stacks.of_frames(seg.get("frames")))
        for b in blocks:
            if str(b.get("state", "")) not in LIVE_STATES:
                continue
            frames, req = b.get("frames"), b.get("requested_size")
            hist = b.get("history")  # files older than mid-2023: history instead of frames
            if isinstance(hist, list) and hist and isinstance(hist[-1], dict):
                frames = frames if frames is not None else hist[-1].get("frames")
                req = req if req is not None else hist[-1].get("real_size")
            size = int(b.get("size", 0))
            ba.append(int(b.get("address", 0)))
            bs.append(size)
            br.append(int(req if req is not None else size))
            bt.append(stream)
            bf.append(table.site_of(frames))
            bk.append(stacks.of_frames(frames))
    u64, i32 = np.uint64, np.int32
    return FinalState(
        np.array(sa, u64), np.array(ss, u64), np.array(st, u64), np.array(sx, bool), np.array(sf, i32),
        np.array(sk, i32), np.array(ba, u64), np.array(bs, u64), np.array(br, u64), np.array(bt, u64),
        np.array(bf, i32), np.array(bk, i32),
    )


class Grid:
    """The cut points of one device's expandable-segment ranges (sorted unique addresses)."""

    def __init__(self, h: History, fs: FinalState) -> None:
        m = (h.action == SEGMENT_MAP) | (h.action == SEGMENT_UNMAP)
        fx = fs.seg_expandable
        pts = [h.addr[m], h.addr[m] + h.size[m], fs.seg_addr[fx], fs.seg_addr[fx] + fs.seg_size[fx]]
        self.cuts = np.unique(np.concatenate(pts)) if any(len(p) for p in pts) else np.zeros(0, np.uint64)

    def cells(self, start: int, size: int) -> tuple[int, int]:
        """Cell indices [lo, hi) that tile [start, start + size)."""
        lo = int(np.searchsorted(self.cuts, np.uint64(start)))
        hi = int(np.searchsorted(self.cuts, np.uint64(start + size)))
        return lo, hi

    def pieces(self, addr: np.ndarray, size: np.ndarray, *, limit: int | None = None,
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cell count per range, cell starts, cell sizes) for ranges given as columns.

        InputError, before any cell is built, when there would be more than ``limit`` cells
        (overlapping mappings can multiply a small file into millions of rows).
        """
        lo = np.searchsorted(self.cuts, addr)
        hi = np.searchsorted(self.cuts, addr + size)
        n = (hi - lo).astype(np.int64)
        if limit is not None and int(n.sum()) > limit:
            raise InputError(f"the expandable segments' mappings would become {int(n.sum()):,} rows, more "
                             f"than the {limit:,} this history can hold (2^20 + 64 per entry)")
        idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)]) if len(n) else \
            np.zeros(0, np.int64)
        idx = idx.astype(np.int64)
        return n, self.cuts[idx], self.cuts[idx + 1] - self.cuts[idx]


def initial_rows(h: History, fs: FinalState, grid: Grid, divisions_round: Any) -> Rows:
    """segment_alloc rows for every segment and malloc rows for every block live before ``h``."""
    ev = np.arange(len(h), dtype=np.int64)
    # Blocks: the first event of each address decides.
    bm = (h.action == ALLOC) | (h.action == FREE_COMPLETED)
    b_ev = ev[bm]
    b_seen, b_first = np.unique(h.addr[bm], return_index=True)
    from_free = b_ev[b_first][h.action[b_ev[b_first]] == FREE_COMPLETED]
    keep_final = ~np.isin(fs.blk_addr, b_seen)
    req_free = h.size[from_free]
    blk_addr = np.concatenate([h.addr[from_free], fs.blk_addr[keep_final]])
    blk_req = np.concatenate([req_free, fs.blk_req[keep_final]])
    blk_round = np.concatenate([divisions_round(req_free), fs.blk_size[keep_final]])
    blk_stream = np.concatenate([h.stream[from_free], fs.blk_stream[keep_final]])
    blk_site = np.concatenate([np.full(len(from_free), -1, np.int32), fs.blk_site[keep_final]])
    blk_stack = np.concatenate([np.full(len(from_free), -1, np.int32), fs.blk_stack[keep_final]])
    # Plain segments, same rule.
    sm = (h.action == SEGMENT_ALLOC) | (h.action == SEGMENT_FREE)
    s_ev = ev[sm]
    s_seen, s_first = np.unique(h.addr[sm], return_index=True)
    s_from_free = s_ev[s_first][h.action[s_ev[s_first]] == SEGMENT_FREE]
    plain = ~fs.seg_expandable & ~np.isin(fs.seg_addr, s_seen)
    seg_addr = [h.addr[s_from_free], fs.seg_addr[plain]]
    seg_size = [h.size[s_from_free], fs.seg_size[plain]]
    seg_stream = [h.stream[s_from_free], fs.seg_stream[plain]]
    seg_site = [np.full(len(s_from_free), -1, np.int32), fs.seg_site[plain]]
    seg_stack = [np.full(len(s_from_free), -1, np.int32), fs.seg_stack[plain]]
    ex_addr, ex_size, ex_stream = _initial_cells(h, fs, grid)
    seg_addr.append(ex_addr)
    seg_size.append(ex_size)
    seg_stream.append(ex_stream)
    seg_site.append(np.full(len(ex_addr), -1, np.int32))
    seg_stack.append(np.full(len(ex_addr), -1, np.int32))
    sa, ss = np.concatenate(seg_addr), np.concatenate(seg_size)
    expandable = np.concatenate([np.zeros(len(sa) - len(ex_addr), bool), np.ones(len(ex_addr), bool)])
    so, bo = np.argsort(sa, kind="stable"), np.argsort(blk_addr, kind="stable")
    ns, nb = len(sa), len(blk_addr)
    return Rows(
        op=np.concatenate([np.full(ns, 2, np.int8), np.zeros(nb, np.int8)]),  # segment_alloc, malloc
        addr=np.concatenate([sa[so], blk_addr[bo]]),
        size=np.concatenate([ss[so], blk_req[bo]]),
        rounded=np.concatenate([np.zeros(ns, np.uint64), blk_round[bo]]),
        stream=np.concatenate([np.concatenate(seg_stream)[so], blk_stream[bo]]),
        site=np.concatenate([np.concatenate(seg_site)[so], blk_site[bo]]),
        stack=np.concatenate([np.concatenate(seg_stack)[so], blk_stack[bo]]),
        expandable=np.concatenate([expandable[so], np.zeros(nb, bool)]),
    )


def _initial_cells(h: History, fs: FinalState, grid: Grid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid cells mapped before ``h``: first touched by an unmap, or mapped at the end and never touched."""
    cuts = grid.cuts
    first: dict[int, tuple[int, int]] = {}  # cell -> (action, stream)
    for i in np.flatnonzero((h.action == SEGMENT_MAP) | (h.action == SEGMENT_UNMAP)):
        lo, hi = grid.cells(int(h.addr[i]), int(h.size[i]))
        for c in range(lo, hi):
            first.setdefault(c, (int(h.action[i]), int(h.stream[i])))
    cells = {c: s for c, (a, s) in first.items() if a == SEGMENT_UNMAP}
    for j in np.flatnonzero(fs.seg_expandable):
        lo, hi = grid.cells(int(fs.seg_addr[j]), int(fs.seg_size[j]))
        for c in range(lo, hi):
            if c not in first:
                cells[c] = int(fs.seg_stream[j])
    idx = np.array(sorted(cells), dtype=np.int64)
    if not len(idx):
        z = np.zeros(0, np.uint64)
        return z, z, z
    return cuts[idx], cuts[idx + 1] - cuts[idx], np.array([cells[c] for c in idx], np.uint64)
