"""The timeline figure's data: enveloped series from the analyzer's per-event table.

Inputs are the analyzer's timeline columns (bytes per event row) and its
summary; nothing here recomputes a metric. Series are ``live_bytes``,
``requested_bytes``, ``reserved_bytes``, ``largest_free_block`` and, where the
metadata gave the device total, ``device_free`` (derived: free at start − reserved,
labelled so, and left out where the trace measured the device); the device free
*measured* at device-level rows is drawn as points; ``external_fragmentation``
(1 − largest_free_block / free_in_pool, a fraction) goes on a second axis as
a percentage. Each series is reduced to a per-pixel min/max envelope
(``tracekit.report.envelope``), and the OOM marker sits at the x of the row
whose ``seq`` is the fatal OOM's (``Marks``, from the summary); every OOM the program survived
gets a lighter marker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tracekit.report.envelope import Envelope, envelope
from tracekit.report.style import Scale, TimeAxis, byte_scale, time_axis
from tracekit.trace.arrow import filled, floats_of
from tracekit.trace.events import seq_row

if TYPE_CHECKING:
    from tracekit.analysis.summary import Summary

SERIES = (
    ("requested_bytes", "requested", "requested"),  # first, so the live curve is drawn over it
    ("live_bytes", "live", "live (allocated)"),
    ("reserved_bytes", "reserved", "reserved (segments)"),
    ("largest_free_block", "largest_free", "largest free block"),
    ("device_free", "device_free", "free at start - reserved (derived, not measured)"),
)


@dataclass(frozen=True, eq=False)
class TimelineData:
    """What the timeline figure draws, in bytes and axis units."""

    axis: TimeAxis
    series: dict[str, Envelope]  # key from SERIES -> envelope in bytes
    frag: Envelope | None  # percent; None for a raw-device trace (no pool, nothing to fragment)
    scale: Scale
    oom_seq: int | None
    oom_x: float | None
    oom_text: str | None
    rows: int
    reserved_is_live: bool = False
    limit: int | None = None  # pool / process limit in bytes, where the trace records one
    oom_reserved: int | None = None  # reserved bytes at the OOM: the request is drawn on top of it
    oom_request: int | None = None  # rounded bytes of the failing request
    handled_x: tuple[float, ...] = ()  # x of every OOM the program survived
    measured_free: tuple[np.ndarray, np.ndarray] | None = None  # (x, bytes) where device free was measured


def _col(table: pa.Table, name: str) -> np.ndarray | None:
    if name not in table.column_names:
        return None
    col = table.column(name)
    if col.null_count == len(col):
        return None
    return floats_of(col)  # nulls become NaN


@dataclass(frozen=True)
class Marks:
    """What the timeline marks beside its series, from the analyzer's summary: the fatal OOM (its
    seq, explanation, reserved bytes and rounded request), the limit (bytes), the seqs of the OOMs
    the program survived, and whether the trace is a raw device (no pool: nothing to fragment)."""

    raw_device: bool = False
    oom_seq: int | None = None
    oom_text: str = ""
    oom_reserved: int | None = None
    oom_request: int | None = None
    limit: int | None = None
    handled_seqs: tuple[int, ...] = ()

    @classmethod
    def of(cls, s: Summary) -> Marks:
        o = s.oom
        handled = tuple(x.seq for x in s.ooms if x.handled and (o is None or x.seq != o.seq))
        if o is None:
            return cls(s.raw_device, limit=s.context.limit, handled_seqs=handled)
        return cls(s.raw_device, o.seq, o.explanation, o.reserved_bytes, o.rounded or o.size,
                   s.context.limit, handled)


def timeline_data(
    table: pa.Table, marks: Marks, npix: int = 1200, *, by_index: bool = False
) -> TimelineData:
    """Envelopes of every series of ``table`` and the OOM position from ``marks``.

    ``by_index`` forces the event index on x (to compare two traces whose time axes differ).
    """
    seq = filled(table.column("seq"))
    t_ns = filled(table.column("t_ns"))
    axis = TimeAxis("event index", True, 0, 1.0) if by_index else time_axis(t_ns, seq)
    x = axis.x(t_ns, np.arange(len(seq)))
    series: dict[str, Envelope] = {}
    top = 0.0
    live = _col(table, "live_bytes")
    raw = marks.raw_device
    reserved_is_live = False
    measured = _col(table, "device_free_measured")
    for col, key, _ in SERIES:
        y = _col(table, col)
        if y is None:
            continue
        if key == "device_free" and measured is not None:
            continue  # the device was measured: the derived guess would only contradict it
        if key == "largest_free" and raw:
            continue  # no segments, so no free space inside a pool to measure
        if key == "reserved" and live is not None and np.array_equal(y, live):
            reserved_is_live = True  # a raw-device trace: one curve, labelled as both
            continue
        series[key] = envelope(x, y, npix)
        if key != "device_free" and len(y):
            top = max(top, float(np.nanmax(y)))
    frag_y = None if raw else _col(table, "external_fragmentation")
    frag = None if frag_y is None else envelope(x, frag_y * 100.0, npix)
    oom_seq, oom_x, oom_text = marks.oom_seq, None, None
    oom_reserved = oom_request = None
    if oom_seq is not None:
        row = min(seq_row(seq, oom_seq), len(x) - 1)
        oom_x = float(x[row]) if len(x) else 0.0
        oom_text, oom_reserved, oom_request = marks.oom_text, marks.oom_reserved, marks.oom_request
        if oom_reserved is not None and oom_request:
            top = max(top, float(oom_reserved + oom_request))
    limit = marks.limit
    if limit:
        top = max(top, float(limit))
    rows = np.minimum(np.searchsorted(seq, np.array(marks.handled_seqs, np.uint64)), max(len(x) - 1, 0))
    handled_x = tuple(float(v) for v in x[rows]) if len(x) else ()
    points = None
    if measured is not None:
        ok = ~np.isnan(measured)
        points = (x[ok], measured[ok])
    return TimelineData(
        axis,
        series,
        frag,
        byte_scale(top),
        oom_seq,
        oom_x,
        oom_text,
        len(seq),
        reserved_is_live,
        limit,
        oom_reserved,
        oom_request,
        handled_x,
        points,
    )


