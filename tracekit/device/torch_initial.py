"""A wrapped history's starting state, rebuilt inside PyTorch's real allocator before the replay.

An imported snapshot whose ring buffer wrapped starts with ``initial`` rows:
the segments the allocator held and the blocks live at that moment. The
replay rebuilds them segment by segment, in address order, through the same
``raw_alloc``/``raw_delete`` calls:

- a large segment of S bytes is made by allocating S (PyTorch gives a request
  of 10 MiB or more a segment of exactly its 2 MiB-rounded size) and freeing
  it; a small (2 MiB) segment is made by its first piece;
- the segment is then carved in address order: each live block, and each
  free gap as a *filler*, is allocated in turn; best fit takes the one free
  block there is (everything built before is fully carved), and the split
  keeps the front, so each piece lands at its recorded offset. Gaps of a
  small segment are carved in pieces of at most 1 MiB (bigger requests go to
  the large pool); a gap of at most 1 MiB in a large segment cannot be
  requested there, so it joins the piece before it, as PyTorch itself leaves
  such a tail unsplit;
- the fillers are freed at the end, and merge back into the free gaps.

Blocks that still land elsewhere (settings that round a segment's size up,
``max_split_size`` rules) are counted as ``misplaced``. Expandable segments
in the starting state are not rebuilt: DeviceError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.errors import DeviceError
from tracekit.trace.live import round_up
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

MIB = 1 << 20
SMALL_SEGMENT = 2 * MIB


@dataclass(frozen=True)
class Rebuilt:
    """The starting state as made: segments, live blocks, and blocks not at their recorded offset.

    ``addr`` maps each initial malloc row (input index) to its pointer in the replay.
    """

    segments: int
    blocks: int
    misplaced: int
    addr: dict[int, int] = field(repr=False)


def _pieces(base: int, size: int, starts: np.ndarray, sizes: np.ndarray, rows: np.ndarray,
            small: bool) -> list[tuple[int, int, int]]:
    """(offset, bytes, input row or -1 for a filler) covering [base, base + size) in address order."""
    out: list[tuple[int, int, int]] = []
    at = 0

    def gap(nbytes: int) -> None:
        nonlocal at
        if nbytes <= 0:
            return
        if small:
            while nbytes > 0:
                step = min(nbytes, MIB)
                out.append((at, step, -1))
                at, nbytes = at + step, nbytes - step
        elif nbytes <= MIB and out:
            off, b, row = out[-1]
            out[-1] = (off, b + nbytes, row)  # an unsplittable tail: the piece before takes it
            at += nbytes
        else:
            out.append((at, nbytes, -1))
            at += nbytes

    for s, b, r in zip(starts.tolist(), sizes.tolist(), rows.tolist(), strict=True):
        gap(s - base - at)
        out.append((at, b, r))
        at += b
    gap(size - at)
    return out


def rebuild(trace: Trace, init: np.ndarray, backend: Any, handles: np.ndarray) -> Rebuilt:
    """Make the starting state; ``handles``: the replay's stream handle per input row."""
    ev = trace.events
    segs = np.flatnonzero(init & (ev.op == Op.SEGMENT_ALLOC))
    tbl = trace.extras
    if tbl is not None and "expandable" in tbl.column_names:
        exp = np.asarray(tbl.column("expandable").fill_null(False).to_numpy(zero_copy_only=False), bool)
        if exp[segs].any():
            raise DeviceError(f"{trace.path}: the starting state holds expandable segments, which a device "
                              "replay cannot rebuild; replay it with --sim torch")
    segs = segs[np.argsort(ev.addr[segs], kind="stable")]
    blocks = np.flatnonzero(init & (ev.op == Op.MALLOC))
    blocks = blocks[np.argsort(ev.addr[blocks], kind="stable")]
    baddr = ev.addr[blocks].astype(np.int64)
    bsize = np.where(ev.rounded[blocks] > 0, ev.rounded[blocks], round_up(ev.size[blocks]))
    delete = backend.delete
    fillers: list[int] = []
    placed: dict[int, int] = {}
    misplaced = 0
    try:
        for s in segs.tolist():
            misplaced += _segment(ev, s, baddr, bsize, blocks, backend, handles, fillers, placed)
    except BaseException:
        for p in [*fillers, *placed.values()]:  # nothing taken may stay behind
            delete(p)
        raise
    for p in fillers:
        delete(p)
    return Rebuilt(len(segs), len(placed), misplaced, placed)


def _segment(ev: Any, s: int, baddr: np.ndarray, bsize: np.ndarray, blocks: np.ndarray, backend: Any,
             handles: np.ndarray, fillers: list[int], placed: dict[int, int]) -> int:
    """Make and carve initial segment row ``s``; returns how many of its blocks are misplaced."""
    base, size, h = int(ev.addr[s]), int(ev.size[s]), int(handles[s])
    lo, hi = np.searchsorted(baddr, [base, base + size])
    small = size <= SMALL_SEGMENT
    seg_base = -1
    if not small:
        seg_base = int(backend.alloc(size, h))
        backend.delete(seg_base)
    misplaced = 0
    pieces = _pieces(base, size, baddr[lo:hi], bsize[lo:hi].astype(np.int64), blocks[lo:hi], small)
    for off, nbytes, row in pieces:
        p = int(backend.alloc(nbytes, h))
        if seg_base < 0:
            seg_base = p
        if row < 0:
            fillers.append(p)
            continue
        placed[row] = p
        misplaced += p - seg_base != off
    return misplaced
