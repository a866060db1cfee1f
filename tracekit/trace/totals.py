"""Running totals a trace must keep below 2^62: live bytes (blocks) and reserved bytes (segments).

Every single size is below 2^62 already; their running sums are what the analyzer and the
replays add up in int64, so a trace whose sums would reach 2^62 is refused when read. The
sums are kept in one compiled pass in event order: ``live += rounded`` at a kept malloc,
``live -= rounded(its malloc)`` at a kept, paired free, and the same for segments with
``size``. Each sum is exact in int64 up to its first step past 2^62 (every step is below 2^62),
and that first step is all that is looked for.

No block or segment may run past the end of the 64-bit address space either:
``addr + rounded`` (a block) or ``addr + size`` (a segment) above 2^64 is no range any
device has, and a sum that wraps would make a 1 TiB block look as if it lay inside a
1 MiB segment at the top of the address space.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracekit.errors import TraceFormatError
from tracekit.trace.events import Events
from tracekit.trace.schema import Op

MAX_SIZE = 1 << 62  # no allocation is 4 EiB; larger sizes would wrap once arithmetic moves to int64
_TOP = np.uint64((1 << 64) - 1)
_CHUNK = 1 << 20  # rows per pass of the range check: its temporaries stay a few MiB at any length


def check_totals(p: Path, ev: Events, mate: np.ndarray, keep: np.ndarray) -> None:
    """Refuse ``p`` (TraceFormatError) if live or reserved bytes reach 2^62 at some event."""
    from tracekit.trace._kernels import first_over  # numba: loaded at the first read's checks

    i, what = first_over(ev.op, ev.rounded, ev.size, mate, keep, np.int64(MAX_SIZE))
    if i >= 0:
        raise over_error(p, ev, int(i), reserved=what == 1)


def over_error(p: Path, ev: Events, i: int, *, reserved: bool) -> TraceFormatError:
    """The sentence for live (or ``reserved``) bytes reaching 2^62 at event i."""
    name = "reserved bytes" if reserved else "live bytes"
    return TraceFormatError(f"{p}: {name} reach 2^62 or more at seq {int(ev.seq[i])}, beyond any device")


def check_ranges(p: Path, ev: Events, keep: np.ndarray) -> None:
    """Refuse ``p`` (TraceFormatError) if a kept block or segment ends past 2^64 (``first_past_end``)."""
    i = first_past_end(ev, keep)
    if i is not None:
        raise past_end_error(p, ev, i)


def first_past_end(ev: Events, keep: np.ndarray) -> int | None:
    """The first kept event whose block ``[addr, addr + rounded)`` or segment ``[addr, addr + size)``
    ends past 2^64 (``length - 1 > 2^64 - 1 - addr``, in uint64), or None."""
    for lo in range(0, len(ev), _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        op, addr = ev.op[sl], ev.addr[sl]
        length = np.where(op == Op.SEGMENT_ALLOC, ev.size[sl], np.where(op == Op.MALLOC, ev.rounded[sl], 0))
        bad = np.flatnonzero(keep[sl] & (length > 0) & (length - np.uint64(1) > _TOP - addr))
        if len(bad):
            return lo + int(bad[0])
    return None


def past_end_error(p: Path, ev: Events, i: int) -> TraceFormatError:
    """The sentence for the block or segment of event i running past 2^64."""
    seg = ev.op[i] == Op.SEGMENT_ALLOC
    length = int(ev.size[i] if seg else ev.rounded[i])
    what = "segment" if seg else "block"
    at = f"{int(ev.addr[i]):#x}"
    return TraceFormatError(f"{p}: the {what} at seq {int(ev.seq[i])} ({length} bytes at {at}) runs past the "
                            "end of the 64-bit address space")
