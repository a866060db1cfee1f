"""The answer of ``tracekit advise``: what fits, the recommended line, or how far from fitting.

``rank_key`` orders the candidates that fit: those within the user's limit before a raised
limit, replay-verified before modelled, comfortable before tight (headroom below
max(2 % of the limit, 20 MiB)), fewer changed settings first, then the lower price
(device calls), then the lower peak reserved. The first is the recommendation.
Headroom = limit − peak reserved (bytes; for a raised ``set_limit``, under the new limit).
When nothing fits, ``min_capacity`` is the smallest capacity (2 MiB steps) under the best
setting tried, next to the lower bound (peak live bytes, 512 B rounded) and the call-sites
holding the most live bytes at the peak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracekit.advise.candidates import Candidate, Kind
from tracekit.advise.evaluate import Outcome
from tracekit.analysis.leaks import SiteBytes
from tracekit.units import format_size

RECORDED_PART = "verified through the failing request; the run past it was not recorded"
TIGHT_MIN = 20 << 20
WHOLE_RUN = "verified through the end of the recorded run; nothing after it was recorded"


def tight(o: Outcome) -> bool:
    """Headroom under max(2 % of the capacity, 20 MiB): a run a little past the recorded part may not fit."""
    cap = o.capacity or 0
    return (o.headroom or 0) < max(cap // 50, TIGHT_MIN)


def rank_key(o: Outcome) -> tuple[int, int, int, int, int, int]:
    return (int(o.candidate.kind == Kind.CUPY_LIMIT), int(not o.verified_by_replay), int(tight(o)),
            o.candidate.keys, o.price, o.peak_reserved)


@dataclass(frozen=True)
class AdviseResult:
    """Everything ``advise`` found (bytes unless noted)."""

    trace: str | None
    kind: str  # torch, cupy or raw
    limit: int
    failing_seq: int | None  # the recorded failing request, None when the run did not fail
    tried: tuple[Outcome, ...]
    fits: tuple[Outcome, ...]  # ranked, recommendation first
    min_capacity: int | None
    min_capacity_setting: Candidate | None
    lower_bound: int
    top_sites: tuple[SiteBytes, ...]
    command: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    device_checks: tuple[Any, ...] = ()  # tracekit.advise.on_device.DeviceCheck, with --verify-on-device

    @property
    def scope(self) -> str:
        return RECORDED_PART if self.failing_seq is not None else WHOLE_RUN

    def line(self, cand: Candidate, capacity: int | None) -> str:
        text = cand.line(capacity, self.trace or "TRACE")
        if cand.kind == Kind.TORCH_CONF and self.command:
            text += f" {self.command}"
        return text

    def recommendation(self) -> str:
        if self.fits:
            o = self.fits[0]
            where = (f"under the limit of {format_size(self.limit)}" if o.candidate.kind != Kind.CUPY_LIMIT
                     else f"with the pool limit raised to {format_size(o.capacity or 0)}")
            model = "" if o.verified_by_replay else " (by the device-allocator model, not a replay)"
            return (f"{o.label()} fits {where}{model}, peak reserved "
                    f"{format_size(o.peak_reserved)} with {format_size(o.headroom or 0)} headroom; "
                    f"rerun with: {self.line(o.candidate, o.capacity)}")
        text = f"Nothing tried fits under {format_size(self.limit)}"
        if self.min_capacity is not None and self.min_capacity_setting is not None:
            c = self.min_capacity_setting
            text += (f"; the smallest capacity is {format_size(self.min_capacity)} with {c.label()} "
                     f"({self.line(c, self.min_capacity)})")
        text += f"; the live bytes alone need {format_size(self.lower_bound)}"
        if self.top_sites:
            s = self.top_sites[0]
            who = s.site or "unknown call-sites"
            text += f"; shrink what {who} holds ({format_size(s.bytes)} at the peak)"
        return text + "."

    def to_dict(self) -> dict[str, Any]:
        fits = []
        for o in self.fits:
            d = o.to_dict()
            d["line"] = self.line(o.candidate, o.capacity)
            fits.append(d)
        return {
            "trace": self.trace, "kind": self.kind, "limit_bytes": self.limit,
            "failing_seq": self.failing_seq, "fits": fits, "recommendation": self.recommendation(),
            "min_capacity_bytes": self.min_capacity,
            "min_capacity_setting": self.min_capacity_setting.label() if self.min_capacity_setting else None,
            "lower_bound_bytes": self.lower_bound,
            "top_sites_at_peak": [s.to_dict() for s in self.top_sites],
            "tried": [o.to_dict() | {"error": o.error} for o in self.tried],
            "scope": self.scope, "notes": list(self.notes),
            "device_checks": [c.to_dict() for c in self.device_checks],
        }

    def to_text(self) -> str:
        head = [f"limit {format_size(self.limit)} ({self.limit} bytes); {len(self.tried)} settings tried; "
                f"{self.scope}"]
        rows = [("setting", "fits", "peak reserved", "headroom", "device allocs/frees", "verified")]
        for o in sorted(self.tried, key=lambda o: (not o.fits, rank_key(o))):
            rows.append((
                o.label(), "error" if o.error else ("yes" if o.fits else "no"),
                format_size(o.peak_reserved),
                format_size(o.headroom) if o.fits and o.headroom is not None else "",
                f"{o.device_allocs}/{o.device_frees}", "replay" if o.verified_by_replay else "model",
            ))
        w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = head + ["  ".join(f"{c:<{w[i]}}" if i == 0 else f"{c:>{w[i]}}" for i, c in enumerate(r))
                        for r in rows]
        if not self.fits and self.top_sites:
            lines.append("held at the peak of live bytes:")
            lines += [f"  {format_size(s.bytes):>12}  {s.blocks:>6} blocks  {s.site or '(no call-site)'}"
                      for s in self.top_sites]
        lines += [f"note: {n}" for n in self.notes]
        for c in self.device_checks:
            verdict = {True: "confirmed on the device", False: "model and device DISAGREE",
                       None: f"not checked ({c.note})"}[c.agrees]
            lines.append(f"device: {c.setting}: {verdict}")
        lines.append(f"recommendation: {self.recommendation()}")
        return "\n".join(lines)
