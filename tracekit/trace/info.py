"""What ``tracekit info`` reports: metadata, counts per op, time span, devices, streams, stacks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.inputs import safe_text
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path, "metadata": self.meta, "events": self.events, "ops": self.ops,
            "duration_s": self.duration_s, "devices": list(self.devices),
            "streams": list(self.streams), "sites": self.sites,
            "skipped_events": list(self.skipped), "warning_events": list(self.warnings),
            "extra_columns": list(self.extra_columns),
            "stacks": {"used": self.stacks_used, "table": self.stacks, "frames": self.frames},
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
        streams = ", ".join(f"stream {hex(s) if s > 9 else s}" for s in self.streams[:8])
        more = f" (+{len(self.streams) - 8} more)" if len(self.streams) > 8 else ""
        lines.append(f"streams      {streams or 'none'}{more}")
        lines.append(f"call-sites   {self.sites:,}")
        lines.append(f"call stacks  {self.stacks_used:,} in use ({self.stacks:,} in the table, "
                     f"{self.frames:,} frames)")
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
    )
