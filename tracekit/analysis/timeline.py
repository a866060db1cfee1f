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
  metadata gives neither.

The running sums and the largest free block come from one compiled pass
(``largest_free.scan``); the address line is coordinate-compressed here with
NumPy sorts (see ``leaf_ranges``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tracekit.analysis import largest_free as lf
from tracekit.trace.events import Events
from tracekit.trace.schema import Op

COLUMNS = (
    "seq", "t_ns", "live_bytes", "requested_bytes", "reserved_bytes", "free_in_pool",
    "largest_free_block", "external_fragmentation", "device_free",
)


@dataclass(frozen=True, eq=False)
class ScanResult:
    """Raw output of the compiled pass: stats arrays and, if asked, per-event columns."""

    stats: np.ndarray
    fstats: np.ndarray
    pooled: bool
    live: np.ndarray | None = None
    requested: np.ndarray | None = None
    reserved: np.ndarray | None = None
    largest_free: np.ndarray | None = None


def leaf_ranges(ev: Events, mate: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coordinate-compress every range the trace touches into tree leaves.

    Ranges: mallocs ``[addr, addr + rounded)``, segments ``[addr, addr + size)``
    and unpaired frees ``[addr, addr + size)``. Per device, the sorted distinct
    boundaries p_0 < … < p_m−1 give one leaf per position (``[p_k, p_k+1)``, the
    last of length 0) preceded by a zero-length barrier leaf where p_k is
    ever a segment boundary. Returns per-event ``lo``/``hi`` (int32 leaf
    range, set for the opening rows only) and ``leaf_len`` (int64 bytes).
    """
    op = ev.op
    closing = (op == Op.FREE) | (op == Op.SEGMENT_FREE)
    opener = (op == Op.MALLOC) | (op == Op.SEGMENT_ALLOC) | (closing & (mate < 0))
    idx = np.flatnonzero(opener)
    start = ev.addr[idx]
    end = start + np.where(op[idx] == Op.MALLOC, ev.rounded[idx], ev.size[idx])
    is_seg = (op[idx] == Op.SEGMENT_ALLOC) | (op[idx] == Op.SEGMENT_FREE)
    dev = ev.device[idx]
    lo = np.zeros(len(op), np.int32)
    hi = np.zeros(len(op), np.int32)
    lens: list[np.ndarray] = []
    base = 0
    devices = np.unique(dev)
    for d in devices:
        sel = slice(None) if len(devices) == 1 else (dev == d)
        s, e, sg = start[sel], end[sel], is_seg[sel]
        pts = np.unique(np.concatenate([s, e]))
        bnd = np.unique(np.concatenate([s[sg], e[sg]]))
        isb = np.zeros(len(pts), np.int64)
        isb[np.searchsorted(pts, bnd)] = 1
        first = base + np.arange(len(pts), dtype=np.int64) + np.cumsum(isb) - isb
        leaf_len = np.zeros(len(pts) + int(isb.sum()), np.int64)
        leaf_len[first - base + isb[:]] = np.append(np.diff(pts).astype(np.int64), 0)
        lens.append(leaf_len)
        rows = idx[sel]
        lo[rows] = first[np.searchsorted(pts, s)]
        hi[rows] = first[np.searchsorted(pts, e)]
        base += len(leaf_len)
    if base >= 2**31 - 1:
        raise ValueError("too many distinct addresses for the interval structure")
    all_len = np.concatenate(lens) if lens else np.zeros(0, np.int64)
    return lo, hi, all_len


def scan_events(ev: Events, mate: np.ndarray, *, want: bool, probe: int = -1) -> ScanResult:
    """Run the compiled pass over ``ev``; per-event columns only when ``want``."""
    n = len(ev)
    pooled = bool(np.any((ev.op == Op.SEGMENT_ALLOC) | (ev.op == Op.SEGMENT_FREE)))
    if pooled:
        lo, hi, leaf_len = leaf_ranges(ev, mate)
    else:
        lo = hi = np.zeros(0, np.int32)
        leaf_len = np.zeros(0, np.int64)
    m = n if want else 0
    outs = [np.empty(m, np.int64) for _ in range(4)]
    st, fs = lf.scan(ev.op, ev.size, ev.rounded, mate, lo, hi, leaf_len, pooled, probe, want, *outs)
    if not want:
        return ScanResult(st, fs, pooled)
    return ScanResult(st, fs, pooled, *outs)


def timeline_table(ev: Events, scan: ScanResult, device_free_at_start: int | None) -> pa.Table:
    """The per-event timeline as an Arrow table (columns ``COLUMNS``)."""
    assert scan.live is not None and scan.reserved is not None
    assert scan.requested is not None and scan.largest_free is not None
    free = scan.reserved - scan.live
    with np.errstate(divide="ignore", invalid="ignore"):
        frag = np.where(free > 0, 1.0 - scan.largest_free / np.maximum(free, 1), 0.0)
    np.maximum(frag, 0.0, out=frag)
    if device_free_at_start is None:
        dev_free = pa.nulls(len(ev), pa.int64())
    else:
        dev_free = pa.array(np.int64(device_free_at_start) - scan.reserved, pa.int64())
    return pa.table(
        {
            "seq": pa.array(ev.seq, pa.uint64()),
            "t_ns": pa.array(ev.t_ns, pa.int64()),
            "live_bytes": scan.live,
            "requested_bytes": scan.requested,
            "reserved_bytes": scan.reserved,
            "free_in_pool": free,
            "largest_free_block": scan.largest_free,
            "external_fragmentation": frag,
            "device_free": dev_free,
        }
    )
