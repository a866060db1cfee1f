"""Block and segment placements read straight from trace events, for drawing.

A block is a ``malloc`` row and its paired ``free`` (``Trace.mate``): it holds
``[addr, addr + rounded)`` from the malloc's event index to the free's (or to
the end of the trace, index ``n``, when never freed). Segments are the same
for ``segment_alloc`` / ``segment_free`` rows. The address layout squeezes the
address space down to the ranges ever covered by a segment (or, in a trace
without segment rows, by a block), laid end to end in address order, so a
memory map shows "offset within segments" instead of a mostly empty 48-bit
address range. All of it is vectorised NumPy: no object per event.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.trace import Op, Trace


@dataclass(frozen=True, eq=False)
class Spans:
    """Address ranges alive over event-index intervals ``[start, end)``."""

    start: np.ndarray  # int64 event index of the malloc / segment_alloc
    end: np.ndarray  # int64 event index of the free, or n when never freed
    addr: np.ndarray  # uint64
    size: np.ndarray  # uint64 bytes (rounded for blocks)
    site: np.ndarray  # int32 call-site index, -1 none

    def __len__(self) -> int:
        return len(self.start)


def _spans(trace: Trace, op: Op, size_col: str) -> Spans:
    ev = trace.events
    idx = np.flatnonzero(ev.op == op)
    mate = trace.mate[idx]
    end = np.where(mate >= 0, mate, len(ev)).astype(np.int64)
    return Spans(idx.astype(np.int64), end, ev.addr[idx], getattr(ev, size_col)[idx], ev.site[idx])


def blocks(trace: Trace) -> Spans:
    """Every malloc with its lifetime; size is the rounded size the allocator handed out."""
    return _spans(trace, Op.MALLOC, "rounded")


def segments(trace: Trace) -> Spans:
    """Every segment the pool took from the device, with its lifetime."""
    return _spans(trace, Op.SEGMENT_ALLOC, "size")


@dataclass(frozen=True, eq=False)
class AddressLayout:
    """Disjoint address ranges laid end to end: ``offset(a) = base[g] + (a - lo[g])``."""

    lo: np.ndarray  # uint64 start of each merged range, ascending
    hi: np.ndarray  # uint64 end (exclusive)
    base: np.ndarray  # float64 offset of each range on the compacted axis

    @property
    def total(self) -> float:
        return float(self.base[-1] + (self.hi[-1] - self.lo[-1])) if len(self.lo) else 0.0

    def offset(self, addr: np.ndarray) -> np.ndarray:
        g = np.searchsorted(self.lo, addr, side="right") - 1
        g = np.clip(g, 0, max(len(self.lo) - 1, 0))
        return self.base[g] + (addr.astype(np.float64) - self.lo[g].astype(np.float64))


def address_layout(spans: Spans, *, merge_touching: bool = False) -> AddressLayout:
    """Merge overlapping ranges (a segment freed and re-taken at the same address counts once).

    Ranges that only touch stay separate (adjacent segments are distinct), unless
    ``merge_touching`` (blocks of a raw-device trace: one range per contiguous run).
    """
    if len(spans) == 0:
        z = np.zeros(0, dtype=np.uint64)
        return AddressLayout(z, z, np.zeros(0))
    order = np.argsort(spans.addr)
    lo = spans.addr[order]
    hi = lo + spans.size[order]
    run_hi = np.maximum.accumulate(hi)
    new = np.ones(len(lo), dtype=bool)
    new[1:] = (lo[1:] > run_hi[:-1]) if merge_touching else (lo[1:] >= run_hi[:-1])
    first = np.flatnonzero(new)
    last = np.append(first[1:], len(lo)) - 1
    glo, ghi = lo[first], run_hi[last]
    lengths = (ghi - glo).astype(np.float64)
    base = np.concatenate(([0.0], np.cumsum(lengths)[:-1]))
    return AddressLayout(glo, ghi, base)


def layout_for(b: Spans, seg: Spans) -> tuple[AddressLayout, bool]:
    """The layout over segments, or over blocks when the trace has no segment rows (then False)."""
    if len(seg):
        return address_layout(seg), True
    return address_layout(b, merge_touching=True), False


def rank_sites(b: Spans, n_sites: int) -> np.ndarray:
    """Call-site indices by bytes x lifetime (area on the memory map), largest first; no-site excluded."""
    if n_sites == 0 or len(b) == 0:
        return np.zeros(0, dtype=np.int64)
    has = b.site >= 0
    area = b.size[has].astype(np.float64) * (b.end[has] - b.start[has]).astype(np.float64)
    w = np.bincount(b.site[has], weights=area, minlength=n_sites)
    order = np.argsort(-w, kind="stable")
    return order[w[order] > 0]
