"""What ``tracekit info`` reports: metadata, counts per op, time span, devices, streams, stacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np

from tracekit.inputs import safe_text
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size


class PoolLineDict(TypedDict):
    """One pool in ``info --json``: its id (the ``pool`` column's value), device, kind and label as
    the recorder named them, its recorded limit (``trace.outcome.pool_limit``; None: none or not
    known) and its events."""

    id: int
    device: int
    kind: str | None
    label: str | None
    limit_bytes: int | None
    events: int


@dataclass(frozen=True)
class PoolLine:
    """One pool of the trace's ``pool`` column (see ``PoolLineDict``), what ``--pool ID`` names."""

    id: int
    device: int
    kind: str | None
    label: str | None
    limit: int | None  # bytes
    events: int

    def to_dict(self) -> PoolLineDict:
        return {"id": self.id, "device": self.device, "kind": self.kind, "label": self.label,
                "limit_bytes": self.limit, "events": self.events}

    def to_text(self) -> str:
        name = f"{self.id} {safe_text(repr(self.label))}" if self.label is not None else str(self.id)
        limit = f"limit {format_size(self.limit)}" if self.limit else "no limit recorded"
        events = f"{self.events:,} event{'' if self.events == 1 else 's'}"
        return f"{name} (device {self.device}, {limit}): {events}"


SHOWN = 8  # streams and pools named in the text; --json has them all


@dataclass(frozen=True)
class TraceInfo:
    """Summary of one trace. ``duration_s`` = (last t_ns - first t_ns) / 1e9."""

    path: str
    meta: dict[str, Any]
    events: int
    ops: dict[str, int]
    duration_s: float
    devices: tuple[int, ...]
    streams: tuple[int, ...]
    sites: int
    skipped: tuple[str, ...]
    extra_columns: tuple[str, ...]
    warnings: tuple[str, ...] = ()  # inconsistent events that were kept
    stacks_used: int = 0  # distinct stack ids the events name
    stacks: int = 0  # stacks in the table (a used stack's callers included)
    frames: int = 0
    pools: tuple[PoolLine, ...] = ()  # only where the trace has a ``pool`` column

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "metadata": self.meta, "events": self.events, "ops": self.ops,
            "duration_s": self.duration_s, "devices": list(self.devices),
            "streams": list(self.streams), "sites": self.sites,
            "skipped_events": list(self.skipped), "warning_events": list(self.warnings),
            "extra_columns": list(self.extra_columns),
            "stacks": {"used": self.stacks_used, "table": self.stacks, "frames": self.frames},
            "pools": [p.to_dict() for p in self.pools],
        }

    def to_text(self) -> str:
        m = self.meta
        dev = m.get("device") or {}
        lines = [
            f"trace        {safe_text(self.path)}",
            f"source       {m.get('source')}  (schema v{m.get('schema_version')}, "
            f"created {m.get('created_utc') or 'n/a'})",
        ]
        if dev:
            lines.append(
                f"device       {safe_text(dev.get('name') or 'n/a')}: "
                f"total {format_size(dev.get('total_bytes'))},"
                f" free at start {format_size(dev.get('free_bytes'))}"
            )
        if m.get("pool_limit_bytes") is not None:
            lines.append(f"pool limit   {format_size(m['pool_limit_bytes'])}")
        if m.get("command"):
            lines.append(f"command      {safe_text(m['command'])}")
        lines.append(f"events       {self.events:,} over {self.duration_s:.3f} s")
        for op, c in self.ops.items():
            lines.append(f"  {op:<14}{c:>14,}")
        # Named, not bare ordinals: "devices 0" would read as a count of zero devices.
        lines.append(f"devices      {', '.join(f'device {d}' for d in self.devices) or 'none'}")
        streams = ", ".join(f"stream {hex(s) if s > 9 else s}" for s in self.streams[:SHOWN])
        more = f" (+{len(self.streams) - SHOWN} more)" if len(self.streams) > SHOWN else ""
        lines.append(f"streams      {streams or 'none'}{more}")
        lines.append(f"call-sites   {self.sites:,}")
        lines.append(f"call stacks  {self.stacks_used:,} in use ({self.stacks:,} in the table, "
                     f"{self.frames:,} frames)")
        for i, pool in enumerate(self.pools[:SHOWN]):
            lines.append(f"{'pools' if i == 0 else '':<13}{pool.to_text()}")
        if len(self.pools) > SHOWN:
            lines.append(f"{'':<13}(+{len(self.pools) - SHOWN} more: --json lists them)")
        if self.extra_columns:
            lines.append(f"extra cols   {', '.join(self.extra_columns)}")
        for s in self.skipped:
            lines.append(f"warning      skipped {s}")
        for s in self.warnings:
            lines.append(f"warning      kept {s}")
        return "\n".join(lines)


def trace_info(trace: Trace) -> TraceInfo:
    ev = trace.events
    counts = np.bincount(ev.op.astype(np.int64), minlength=len(Op))
    dur = float(ev.t_ns[-1] - ev.t_ns[0]) / 1e9 if len(ev) else 0.0
    return TraceInfo(
        path=str(trace.path),
        meta=trace.meta.to_dict(),
        events=len(ev),
        ops={op.label: int(counts[op]) for op in Op},
        duration_s=dur,
        devices=tuple(int(d) for d in np.unique(ev.device)),
        streams=tuple(int(s) for s in np.unique(ev.stream)),
        sites=len(ev.sites),
        skipped=tuple(i.describe() for i in trace.issues),
        warnings=tuple(i.describe() for i in trace.warnings),
        extra_columns=tuple(trace.extras.column_names) if trace.extras is not None else (),
        stacks_used=int(len(np.unique(ev.stack[ev.stack >= 0]))),
        stacks=ev.stacks.n_stacks,
        frames=ev.stacks.n_frames,
        pools=_pools(trace),
    )


def _pools(trace: Trace) -> tuple[PoolLine, ...]:
    """The pools of the trace's ``pool`` column with their events (by (device, pool): an id counts
    (pool, device) pairs, so one id is on one device), described by their ``pools`` entries; none
    where the trace has no such column."""
    from tracekit.trace.devices import marks_pools, pool_ids

    if not marks_pools(trace):
        return ()
    from tracekit.trace.outcome import pool_limit

    ids, dev = pool_ids(trace), trace.events.device.astype(np.int64)
    pairs, counts = np.unique(np.stack([dev, ids]), axis=1, return_counts=True)
    entries = {(p.device, p.id): p for p in trace.meta.recorded.pools}
    out = []
    for (d, i), n in zip(pairs.T.tolist(), counts.tolist(), strict=True):
        e = entries.get((d, i))
        out.append(PoolLine(i, d, e.kind if e else None, e.label if e else None,
                            pool_limit(trace.meta, i, d), n))
    return tuple(out)
