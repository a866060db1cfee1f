"""The version-2 parts of a recorded trace, assembled from the spool when it is written.

Columns: ``pool`` (a block row takes its segment's pool, see
``tracekit.record.resolve``; null where no recorded pool holds it) and
``device_free`` (``cudaMemGetInfo`` free bytes measured at device-level events
and OOMs, null elsewhere); a block row's ``device`` is its segment's.
Metadata: ``pools`` (from the pool notes, unless the recording passes the
list with the limits read at the end), ``oom_states`` (the measured state of
each ``oom`` row's note, with the row's seq and time), ``exit.oom_seq`` (the
seq of the OOM whose note index the program's final exception carried) and
``device_mismatches`` (the hook's count plus the rows whose segment was on
another device). Spools from before version 2 lack the two columns and read
as "resolve" and "not measured".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.record.resolve import SegmentIndex, resolve

__all__ = ["EXTRA_FIELDS", "SegmentIndex", "batch_columns", "segment_index", "segment_rows", "v2_meta"]
from tracekit.trace.schema import Op

EXTRA_FIELDS = (pa.field("pool", pa.uint16()), pa.field("device_free", pa.int64()))


def _col(batch: pa.RecordBatch, name: str, fill: int, dtype: type) -> np.ndarray:
    if name in batch.schema.names:
        return batch.column(name).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return np.full(batch.num_rows, fill, dtype)


def segment_rows(batch: pa.RecordBatch, first_seq: int) -> np.ndarray:
    """The segment rows of a spool batch as an (n, 6) array: seq, op, addr, size, pool, device."""
    op = batch.column("op").to_numpy()
    events = op >= 0
    seq = first_seq + np.cumsum(events) - 1
    seg = (op == Op.SEGMENT_ALLOC) | (op == Op.SEGMENT_FREE)
    cols = [seq, op, batch.column("addr").to_numpy().astype(np.int64), batch.column("size").to_numpy(),
            _col(batch, "pool", -1, np.int64), batch.column("device").to_numpy()]
    return np.stack([np.asarray(c, np.int64)[seg] for c in cols], axis=1) if seg.any() \
        else np.zeros((0, 6), np.int64)


def segment_index(parts: list[np.ndarray]) -> SegmentIndex:
    rows = np.concatenate(parts) if parts else np.zeros((0, 6), np.int64)
    return SegmentIndex.build(rows[:, 0], rows[:, 1], rows[:, 2].astype(np.uint64), rows[:, 3],
                              rows[:, 4], rows[:, 5])


def batch_columns(batch: pa.RecordBatch, keep: np.ndarray, seq: np.ndarray, index: SegmentIndex
                  ) -> tuple[np.ndarray, dict[str, pa.Array], int]:
    """(device, the v2 extra columns, device mismatches) of the kept (event) rows of a batch."""
    op = batch.column("op").to_numpy()[keep]
    addr = batch.column("addr").to_numpy()[keep]
    device = batch.column("device").to_numpy()[keep]
    pool = _col(batch, "pool", -1, np.int32)[keep]
    free = _col(batch, "device_free", -1, np.int64)[keep]
    pool, device, mismatches = resolve(index, seq, op, addr, pool, device)
    extras = {
        "pool": pa.array(np.maximum(pool, 0), type=pa.uint16(), mask=pool < 0),
        "device_free": pa.array(free, type=pa.int64(), mask=free < 0),
    }
    return device, extras, mismatches


def v2_meta(notes: list[dict[str, Any]], extra: dict[str, Any], mismatches: int) -> dict[str, Any]:
    """The v2 metadata keys from the spool's notes and what the recording passes in ``extra``."""
    out: dict[str, Any] = {}
    states = []
    by_note: dict[int, int] = {}
    for n in notes:
        if n.get("kind") == "oom":
            by_note[int(n.get("note", -1))] = int(n["seq"])
            state = dict(n.get("state") or {})
            states.append({"seq": int(n["seq"]), "device": state.pop("device", n.get("device")),
                           "t_ns": n.get("t_ns"), **state})
    out["oom_states"] = states
    if "pools" not in extra:
        pools = [n["entry"] for n in notes if n.get("kind") == "pool" and isinstance(n.get("entry"), dict)]
        out["pools"] = sorted(pools, key=lambda e: int(e["id"]))
    exit_info = extra.get("exit")
    if isinstance(exit_info, dict) and "oom_note" in exit_info:
        info = dict(exit_info)
        note = info.pop("oom_note")
        if note == "last":  # an out-of-memory exception without the hook's mark: the latest OOM
            info["oom_seq"] = states[-1]["seq"] if states else None
        else:
            info["oom_seq"] = by_note.get(note) if note is not None else None
        out["exit"] = info
    out["device_mismatches"] = int(extra.get("device_mismatches") or 0) + mismatches
    return out
