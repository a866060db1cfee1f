"""Per-event memory timeline: live, requested, reserved, free, largest free block, fragmentation.

Definitions (bytes unless noted; every value is the state *after* the event):

- ``live_bytes`` = Σ rounded sizes of live blocks (a malloc adds its ``rounded``,
  its free subtracts the same amount).
- ``requested_bytes`` = Σ requested sizes of live blocks.
- ``reserved_bytes`` = Σ sizes of live segments; a trace without segment rows
  is a raw-device trace and ``reserved_bytes`` = ``live_bytes``.
- ``free_in_pool`` = reserved_bytes − live_bytes.
- ``largest_free_block`` = the longest run of addresses inside one live
  segment covered by no live block (0 for raw-device traces).
- ``external_fragmentation`` = 1 − largest_free_block / free_in_pool, 0 when
  free_in_pool ≤ 0 (float64, in [0, 1)).
- ``device_free`` = device_free_at_start − reserved_bytes, i.e. total − reserved
  − overhead at start (overhead = total − free at start); null when the
  metadata gives neither. *Derived*: it assumes nothing but the pool took memory
  after the start.
- ``device_free_measured`` = cudaMemGetInfo free recorded at the row (the
  trace's ``device_free`` column, trace format v2); null where not measured.
- ``device``: the row's device; each device's rows are its own timeline.

The running sums and the largest free block come from one compiled pass
(``largest_free.scan``) over addresses coordinate-compressed here
(``position_ranges``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tracekit.analysis import largest_free as lf
from tracekit.analysis.compress import compress, opening_ranges
from tracekit.trace.arrow import array_of
from tracekit.trace.events import Events
from tracekit.trace.schema import Op

COLUMNS = (
    "seq", "t_ns", "live_bytes", "requested_bytes", "reserved_bytes", "free_in_pool",
    "largest_free_block", "external_fragmentation", "device_free", "device", "device_free_measured",
)


@dataclass(frozen=True, eq=False)
class ScanResult:
    """Raw output of the compiled pass: stats arrays and, if asked, per-event columns."""

    stats: np.ndarray
    fstats: np.ndarray
    pooled: bool
    probed: np.ndarray  # (len(probes), N_PROBE): live, requested, reserved, largest free after each probe
    live: np.ndarray | None = None
    requested: np.ndarray | None = None
    reserved: np.ndarray | None = None
    largest_free: np.ndarray | None = None
    free: np.ndarray | None = None  # reserved − live
    fragmentation: np.ndarray | None = None  # 1 − largest_free / free, 0 when nothing is free


def position_ranges(ev: Events, mate: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coordinate-compress every range the trace touches.

    Ranges: mallocs ``[addr, addr + rounded)``, segments ``[addr, addr + size)``
    and unpaired frees ``[addr, addr + size)``. Per device, the sorted distinct
    boundaries become positions (devices get disjoint index ranges). Returns
    per-event ``lo``/``hi`` (int64 position indices, set for the opening rows
    only) and ``pos`` (int64, the address of each position).
    """
    idx, bounds = opening_ranges(ev.op, ev.addr, ev.size, ev.rounded, mate)
    k = len(idx)
    lo = np.zeros(len(ev), np.int64)
    hi = np.zeros(len(ev), np.int64)
    dev = ev.device[idx]
    if k == 0 or dev.min() == dev.max():  # one device: no split needed
        pts, inv = compress(bounds)
        lo[idx] = inv[:k]
        hi[idx] = inv[k:]
        return lo, hi, pts.astype(np.int64)
    parts: list[np.ndarray] = []
    base = 0
    for d in np.unique(dev):
        sel = np.flatnonzero(dev == d)
        pts, inv = compress(np.concatenate([bounds[sel], bounds[k + sel]]))
        lo[idx[sel]] = base + inv[: len(sel)]
        hi[idx[sel]] = base + inv[len(sel):]
        parts.append(pts.astype(np.int64))
        base += len(pts)
    return lo, hi, (np.concatenate(parts) if parts else np.zeros(0, np.int64))


def scan_events(ev: Events, mate: np.ndarray, *, want: bool, probes: np.ndarray | None = None,
                merge_adjacent: bool = False) -> ScanResult:
    """Run the compiled pass over ``ev``; per-event columns only when ``want``.

    ``probes``: increasing event indices whose state after the event is kept
    (``ScanResult.probed``); ``merge_adjacent``: adjacent segments form one
    free space (expandable segments).
    """
    probes = np.zeros(0, np.int64) if probes is None else np.asarray(probes, np.int64)
    n = len(ev)
    pooled = bool(np.any((ev.op == Op.SEGMENT_ALLOC) | (ev.op == Op.SEGMENT_FREE)))
    if pooled:
        lo, hi, pos = position_ranges(ev, mate)
    else:
        lo = hi = pos = np.zeros(0, np.int64)
    m = n if want else 0
    outs = [np.empty(m, np.int64) for _ in range(5)] + [np.empty(m, np.float64)]
    st, fs, probed = lf.scan(ev.op, ev.size, ev.rounded, ev.t_ns, mate, lo, hi, pos, pooled,
                             merge_adjacent, probes, want, *outs)
    if not want:
        return ScanResult(st, fs, pooled, probed)
    return ScanResult(st, fs, pooled, probed, *outs)


def timeline_table(ev: Events, scan: ScanResult, device_free_at_start: int | None,
                   measured: np.ndarray | None = None) -> pa.Table:
    """The per-event timeline as an Arrow table (columns ``COLUMNS``).

    ``measured``: the trace's ``device_free`` column (int64, -1 = not measured), or None.
    """
    assert scan.live is not None and scan.reserved is not None
    assert scan.requested is not None and scan.largest_free is not None
    assert scan.free is not None and scan.fragmentation is not None
    free, frag = scan.free, scan.fragmentation
    if device_free_at_start is None:
        dev_free = pa.nulls(len(ev), pa.int64())
    else:
        dev_free = array_of(np.int64(device_free_at_start) - scan.reserved, pa.int64())
    return pa.table(
        {
            "seq": array_of(ev.seq, pa.uint64()),
            "t_ns": array_of(ev.t_ns, pa.int64()),
            "live_bytes": _column(scan.live),
            "requested_bytes": _column(scan.requested),
            "reserved_bytes": _column(scan.reserved),
            "free_in_pool": _column(free),
            "largest_free_block": _column(scan.largest_free),
            "external_fragmentation": _column(frag),
            "device_free": dev_free,
            "device": array_of(ev.device, pa.int16()),
            "device_free_measured": (pa.nulls(len(ev), pa.int64()) if measured is None
                                     else array_of(measured, pa.int64(), mask=measured < 0)),
        }
    )


def _column(values: np.ndarray) -> pa.Array:
    return array_of(values, pa.from_numpy_dtype(values.dtype))
