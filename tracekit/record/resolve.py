"""Which pool and device a block belongs to: the live segment that holds its pointer.

A malloc row knows its pointer but not its pool (CuPy's hook does not say),
and on several devices CuPy 14 may report the wrong device. Every segment
row carries both, and device pointers are unique across devices while a
segment lives (unified virtual addressing), so a block's pool and device are
those of the segment that contains its pointer at that moment:
``base <= addr < base + size`` and ``alloc_seq <= seq < free_seq``.
``SegmentIndex`` holds the segments of a whole recording (few: one per
``cudaMalloc`` of a pool) sorted by base; ``resolve`` looks a batch of rows up
with one ``searchsorted`` (the last segment whose base is at most the
address) and checks the candidate; rows whose candidate fails (an address
range reused by a later segment, at the same base or inside an earlier larger
one) are finished by a compiled kernel that walks back from the candidate to
the first segment that holds the row: the same answer as checking every
segment and keeping the last in (base, alloc seq) order, with no Python per
row. Rows inside no segment (a pool the recorder did not see, an
async pool's rows, which carry their pool already) keep what they have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from tracekit.trace.schema import Op

NO_END = np.iinfo(np.int64).max


@dataclass(frozen=True)
class SegmentIndex:
    """Segments sorted by (base, alloc seq); each with its end address, lifetime, pool and device."""

    base: np.ndarray  # uint64
    end: np.ndarray  # uint64, exclusive
    alloc_seq: np.ndarray  # int64
    free_seq: np.ndarray  # int64, NO_END while live at the end
    pool: np.ndarray  # int32
    device: np.ndarray  # int16

    @classmethod
    def build(cls, seq: np.ndarray, op: np.ndarray, addr: np.ndarray, size: np.ndarray,
              pool: np.ndarray, device: np.ndarray) -> SegmentIndex:
        """From every segment row of a recording, in seq order (frees pair with the last alloc)."""
        rows: list[list[int]] = []
        live: dict[tuple[int, int], int] = {}
        for s, o, a, n, p, d in zip(seq.tolist(), op.tolist(), addr.tolist(), size.tolist(),
                                    pool.tolist(), device.tolist(), strict=True):
            if o == Op.SEGMENT_ALLOC:
                live[(d, a)] = len(rows)
                rows.append([a, a + n, s, NO_END, p, d])
            else:
                i = live.pop((d, a), None)
                if i is not None:
                    rows[i][3] = s
        arr = np.array(rows, dtype=np.int64).reshape(-1, 6) if rows else np.zeros((0, 6), np.int64)
        base = arr[:, 0].astype(np.uint64)
        order = np.lexsort((arr[:, 2], base))
        arr, base = arr[order], base[order]
        return cls(base, arr[:, 1].astype(np.uint64), arr[:, 2], arr[:, 3],
                   arr[:, 4].astype(np.int32), arr[:, 5].astype(np.int16))

    def __len__(self) -> int:
        return len(self.base)

    def lookup(self, seq: np.ndarray, addr: np.ndarray) -> np.ndarray:
        """Index of the segment holding each (seq, addr), -1 where none does."""
        out = np.full(len(seq), -1, np.int64)
        if not len(self) or not len(seq):
            return out
        s = seq.astype(np.int64)
        i = np.searchsorted(self.base, addr, side="right").astype(np.int64) - 1
        j = np.maximum(i, 0)
        ok = (i >= 0) & (addr < self.end[j]) & (self.alloc_seq[j] <= s) & (s < self.free_seq[j])
        out[ok] = j[ok]
        rest = np.flatnonzero(~ok & (i >= 0))  # a reused range: the holder is an earlier segment
        if len(rest):
            out[rest] = _walk_back(i[rest], s[rest], np.ascontiguousarray(addr[rest], np.uint64),
                                   self.end, self.alloc_seq, self.free_seq)
        return out


@njit(cache=True)
def _walk_back(start, seq, addr, end, alloc_seq, free_seq):  # pragma: no cover - compiled
    # Segments are sorted by base, so every k <= start[r] has base <= addr[r]: only the end and
    # the lifetime are left to check. The first hit walking back is the last in sorted order.
    out = np.full(start.shape[0], -1, np.int64)
    for r in range(start.shape[0]):
        a, s = addr[r], seq[r]
        for k in range(start[r], -1, -1):
            if a < end[k] and alloc_seq[k] <= s and s < free_seq[k]:
                out[r] = k
                break
    return out


def resolve(index: SegmentIndex, seq: np.ndarray, op: np.ndarray, addr: np.ndarray, pool: np.ndarray,
            device: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """(pool, device, mismatches) for a batch: block rows take their segment's pool and device.

    ``pool`` is -1 where the recorder did not know it; a known pool is kept.
    ``mismatches`` counts rows whose device disagreed with their segment's.
    """
    pool, device = pool.copy(), device.copy()
    block = (op == Op.MALLOC) | (op == Op.FREE)
    rows = np.flatnonzero(block & (pool < 0))
    if not len(rows):
        return pool, device, 0
    hit = index.lookup(seq[rows], addr[rows])
    found = hit >= 0
    rows, hit = rows[found], hit[found]
    seg_dev = index.device[hit]
    mismatches = int(np.count_nonzero(device[rows] != seg_dev))
    pool[rows] = index.pool[hit]
    device[rows] = seg_dev
    return pool, device, mismatches
