"""The fleet table in polars: one row per trace, typed columns, written as Parquet.

Rows arrive from the workers as ``TraceRow``s; here they become one polars
DataFrame with a fixed schema (so a fleet in which every member failed still
has typed, queryable columns) and, when the heat map was asked for, a
``reserved_curve`` list column (``CURVE_BINS`` int64 values per trace) and
``oom_at``, the fatal OOM's place on that curve's normalised time axis. polars is
imported here only, lazily by the callers: the record, device-replay and
budget paths never load it. The Parquet file is written to a temporary name
beside the target and renamed (``tracekit.outputs``), so an interrupted run leaves
no half file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from tracekit.fleet.inputs import FLEET_KEY
from tracekit.fleet.row import TraceRow
from tracekit.outputs import Staged, cannot_write

SCHEMA: dict[str, Any] = {
    "path": pl.String, "error": pl.String, "source": pl.String, "device": pl.String,
    "device_index": pl.Int64, "rank": pl.Int64, "rank_from": pl.String, "local_rank": pl.Int64,
    "world_size": pl.Int64, "host": pl.String, "events": pl.Int64, "duration_s": pl.Float64,
    "peak_live_bytes": pl.Int64, "peak_live_seq": pl.UInt64, "peak_reserved_bytes": pl.Int64,
    "peak_reserved_seq": pl.UInt64, "max_external_fragmentation": pl.Float64, "oom_count": pl.Int64,
    "ooms_handled": pl.Int64, "oom_device": pl.Int64,
    "oom_seq": pl.UInt64, "oom_size": pl.Int64, "oom_site": pl.String, "oom_user_site": pl.String,
    "oom_request_site": pl.String, "oom_diagnosis": pl.String,
    "oom_explanation": pl.String, "oom_device_free_bytes": pl.Int64, "oom_device_free_source": pl.String,
    "oom_outside_pool_bytes": pl.Int64, "oom_other_processes_bytes": pl.Int64,
    "leaked_bytes": pl.Int64, "limit_bytes": pl.Int64,
}
_OPTIONAL: dict[str, Any] = {"whatif_lower_bound_bytes": pl.Int64, "recommendation": pl.String,
                             "advise_error": pl.String}


def rows_frame(rows: Sequence[TraceRow]) -> pl.DataFrame:
    """The rows as a DataFrame, by rank (rows without one last, in the given order); optional columns
    only where some row has them."""
    rows = [_admitted(r) for r in rows]
    records = [r.record() for r in rows]
    extra = list(dict.fromkeys(k for rec in records for k in rec if k not in SCHEMA and k != "seconds"))
    schema = dict(SCHEMA)
    for k in [*extra, "seconds"]:
        schema[k] = column_type(k)
    df = pl.DataFrame([{k: rec.get(k) for k in schema} for rec in records], schema=schema, orient="row")
    if any(r.curve is not None for r in rows):
        df = df.with_columns(
            pl.Series("reserved_curve", [r.curve.reserved.tolist() if r.curve else None for r in rows],
                      dtype=pl.List(pl.Int64)),
            pl.Series("oom_at", [r.curve.oom_at if r.curve else None for r in rows], dtype=pl.Float64),
        )
    return df.sort("rank", nulls_last=True, maintain_order=True)


# The values a column of each type holds: integers within its range (a trace's seq is uint64), text.
_RANGES = {pl.Int64: (-(1 << 63), 1 << 63), pl.UInt64: (0, 1 << 64)}


def column_type(name: str) -> Any:
    """The polars type of a table column (``min_capacity_*_bytes`` and unknown names: Int64)."""
    if name == "seconds":
        return pl.Float64
    return SCHEMA.get(name) or _OPTIONAL.get(name, pl.Int64)


def _misfit(value: Any, typ: Any) -> bool:
    if value is None:
        return False
    if typ == pl.String:
        return not isinstance(value, str)
    if typ == pl.Float64:
        return isinstance(value, bool) or not isinstance(value, int | float)
    lo, end = _RANGES[typ]
    return isinstance(value, bool) or not isinstance(value, int) or not lo <= value < end


def _admitted(row: TraceRow) -> TraceRow:
    """``row``, or in its place an error row naming the value that fits no column of the table (a
    figure beyond 64 bits, an object where text belongs): one odd member never ends the fleet."""
    for name, value in row.record().items():
        if _misfit(value, typ := column_type(name)):
            return TraceRow.failed(row.path, f"{row.path}: its {name}, {str(value)[:40]}, does not fit the "
                                   f"table's {typ} column", row.seconds)
    return row


def write_parquet(df: pl.DataFrame, path: Path) -> Path:
    """Write ``df`` as zstd Parquet at ``path``, atomically (``tracekit.outputs``), marked as a fleet
    table (``FLEET_KEY``): a later fleet over the same folder passes it by."""
    with Staged(path) as staged:
        try:  # through Arrow, whose failed write keeps the errno (polars' says only "transport error")
            table = df.to_arrow()
            marked = table.replace_schema_metadata({**(table.schema.metadata or {}), FLEET_KEY: b"1"})
            pq.write_table(marked, staged.tmp, compression="zstd")
        except OSError as e:
            raise cannot_write(path, e, "the fleet table") from None
    return path


def json_rows(df: pl.DataFrame) -> list[dict[str, Any]]:
    """The table as ``--json``'s ``rows`` (the heat-map curve left out: it is for the report)."""
    return df.drop("reserved_curve", "oom_at", strict=False).to_dicts()


def rows_text(df: pl.DataFrame, limit: int = 64) -> str:
    """The table as aligned text, one line per trace (the first ``limit``; the rest are counted)."""
    from tracekit.inputs import safe_text
    from tracekit.units import format_size

    head = ("trace", "rank", "events", "peak live", "peak reserved", "max frag", "OOM")
    lines = [head]
    for r in df.head(limit).iter_rows(named=True):
        name = safe_text(Path(r["path"]).name)  # escaped before the columns are measured
        rank = "" if r["rank"] is None else str(r["rank"])
        if r["error"] is not None:
            lines.append((name, rank, "", "", "", "", "unreadable (see below)"))
            continue
        oom = "none" if r["oom_seq"] is None else (
            f"{r['oom_diagnosis']} at seq {r['oom_seq']} ({format_size(r['oom_size'])})")
        lines.append((name, rank, f"{r['events']:,}", format_size(r["peak_live_bytes"]),
                      format_size(r["peak_reserved_bytes"]), f"{r['max_external_fragmentation']:.1%}", oom))
    w = [max(len(row[i]) for row in lines) for i in range(len(head))]
    text = ["  ".join(c.ljust(w[i]) if i in (0, 6) else c.rjust(w[i]) for i, c in enumerate(row)).rstrip()
            for row in lines]
    if df.height > limit:
        text.append(f"... and {df.height - limit:,} more traces (all of them: -o TABLE.parquet or --json)")
    return "\n".join(text)
