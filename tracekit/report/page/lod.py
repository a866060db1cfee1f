"""The timeline at levels of detail: per bucket of events, the minimum and maximum of each series.

The analyzer's per-event timeline (``tracekit.analysis.timeline``; values after each event)
is cut into buckets of ``b`` consecutive events; level ``j`` has buckets of ``b0 * 4**j``
events, where ``b0`` is the smallest power of 4 giving at most ``FINEST`` buckets (so a
trace of up to ``FINEST`` events is drawn event by event). Coarser levels are reduced from
the finer one (min of mins, max of maxes), so a spike inside a bucket is never lost.
NaN (a series not measured there) is ignored within a bucket (``fmin``/``fmax``); a bucket
with no value stays NaN and the page draws a gap. Values are float32 on the wire: the
page shows MiB to three digits, and the exact figures are in the tables.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa

from tracekit.report.page.columns import column
from tracekit.report.page.model import Level, Points, SeriesInfo, Timeline
from tracekit.trace.arrow import filled, floats_of

FINEST = 1 << 16  # buckets of the finest level, at most
COARSEST = 1 << 11  # the coarsest level has about this many buckets (or fewer, for a short trace)

# (analyzer column, page key, label, axis, what it is); the order is the drawing order.
SERIES: tuple[tuple[str, str, str, Literal["pool", "device", "frag"], str], ...] = (
    ("requested_bytes", "requested", "requested", "pool", "the bytes the program asked for, live blocks"),
    ("live_bytes", "live", "live (allocated)", "pool", "the live blocks after the allocator's rounding"),
    ("reserved_bytes", "reserved", "reserved (segments)", "pool",
     "the segments the pool holds from the device"),
    ("largest_free_block", "largest_free", "largest free block", "pool",
     "the largest free piece inside the segments: the largest request the pool could place without growing"),
    ("device_free", "device_free", "device free, derived (right axis)", "device",
     "free at start − reserved: the device's free memory if nothing else took any (not measured)"),
    ("external_fragmentation", "frag", "external fragmentation (strip below)", "frag",
     "1 − largest free block ÷ free in the pool, in %: how split up the pool's free space is; high is common "
     "and harmless until a request needs one large piece"),
)
def _col(table: pa.Table, name: str) -> np.ndarray | None:
    if name not in table.column_names or table.column(name).null_count == len(table):
        return None
    return floats_of(table.column(name))


def bucket_sizes(n: int) -> list[int]:
    """Bucket sizes, finest first: powers of 4 from the finest with <= FINEST buckets up to <= COARSEST."""
    b = 1
    while -(-n // b) > FINEST:
        b *= 4
    out = [b]
    while -(-n // out[-1]) > COARSEST:
        out.append(out[-1] * 4)
    return out


def _reduce(lo: np.ndarray, hi: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge every ``k`` consecutive buckets (the last one may be short)."""
    starts = np.arange(0, len(lo), k)
    return np.fmin.reduceat(lo, starts), np.fmax.reduceat(hi, starts)


def pick_series(table: pa.Table, raw_device: bool) -> dict[str, tuple[SeriesInfo, np.ndarray]]:
    """The series the page draws: derived device free only where nothing was measured, no free block
    or fragmentation for a raw-device trace, reserved only where it differs from live."""
    measured = _col(table, "device_free_measured")
    out: dict[str, tuple[SeriesInfo, np.ndarray]] = {}
    live: np.ndarray | None = None  # reserved is drawn only where it differs from live
    for name, key, label, axis, help_ in SERIES:
        y = _col(table, name)
        if y is None or (key == "device_free" and measured is not None):
            continue
        if raw_device and key in ("largest_free", "frag"):
            continue
        if key == "reserved" and live is not None and np.array_equal(y, live):
            continue
        unit: Literal["bytes", "percent"] = "percent" if key == "frag" else "bytes"
        info = SeriesInfo(key=key, label=label, unit=unit, axis=axis, help=help_)
        live = y if key == "live" else live
        out[key] = (info, y * 100.0 if key == "frag" else y)
    return out


def timeline(table: pa.Table, raw_device: bool, limit: int | None,
             limit_what: str = "pool limit") -> Timeline:
    """Every level of detail of the reported device's timeline rows ``table`` (one row per event)."""
    n = len(table)
    series = pick_series(table, raw_device)
    sizes = bucket_sizes(max(n, 1))
    levels: list[Level] = []
    cur = {k: (y, y) for k, (_, y) in series.items()}
    prev = 1
    for b in sizes:
        cur = {k: _reduce(lo, hi, b // prev) for k, (lo, hi) in cur.items()} if b > 1 else cur
        prev = b
        levels.append(
            Level(
                bucket=b,
                count=-(-n // b),
                lo={k: column(v[0], "f32") for k, v in cur.items()},
                hi={k: column(v[1], "f32") for k, v in cur.items()},
            )
        )
    t = filled(table.column("t_ns"))
    seq = filled(table.column("seq"))
    starts = np.arange(0, n, sizes[0])
    t0 = int(t[0]) if n else 0
    measured = _col(table, "device_free_measured")
    points = None
    if measured is not None:
        ok = np.flatnonzero(~np.isnan(measured))
        points = Points(index=column(ok, "i32", delta=True), bytes=column(measured[ok], "f64"))
    return Timeline(
        n=n,
        t_ns=column((t[starts] - t0).astype(np.float64), "f64", delta=True),
        seq=column(seq[starts].astype(np.float64), "f64", delta=True),
        series=[info for info, _ in series.values()],
        levels=levels[::-1],
        measured_free=points,
        limit_bytes=limit,
        limit_what=limit_what,
    )
