"""The analysis summary: peaks, fragmentation measures, the OOM verdict and leaks.

Johnstone & Wilson's four measures ("The Memory Fragmentation Problem:
Solved?", ISMM '98) compare the memory the allocator holds (H = reserved
bytes) with the memory the program asked for and still holds (Q = requested
bytes of live blocks), so rounding (internal fragmentation) counts as well as
free pieces (external). All four are ratios (0.25 = 25 %), None when the
denominator is 0:

- ``jw1`` = (Σᵢ Hᵢ·Δtᵢ − Σᵢ Qᵢ·Δtᵢ) / Σᵢ Qᵢ·Δtᵢ: time-averaged, the state after
  event i weighted by Δtᵢ = t_ns[i+1] − t_ns[i] (how long it lasted, ns; the last
  event weighs 0). A trace whose events all share one time stamp is averaged per event.
- ``jw2`` = (H at the event of peak Q − peak Q) / peak Q.
- ``jw3`` = (peak H − Q at peak H) / Q at peak H, where Q at peak H is the largest Q
  among the events at which H is at its peak.
- ``jw4`` = (peak H − peak Q) / peak Q (the peaks may fall at different events).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from tracekit.analysis.context import DeviceContext
from tracekit.analysis.diagnosis import Diagnosis
from tracekit.analysis.leaks import SiteBytes, SiteBytesJSON
from tracekit.analysis.oom_budget import FreeSource, OOMBudget
from tracekit.analysis.tree import Trees
from tracekit.inputs import safe_text
from tracekit.units import format_size

HANDLED_SIZES = 5  # requests listed per call-site of handled OOMs


class OOMBriefJSON(TypedDict):
    """An ``ooms`` entry. ``site``: the call-site's label (``tracekit.trace.callsite``: "U in f →
    R", or one frame as ``path:line:function``); ``user_site``/``request_site``: its user frame
    and the frame that made the request, ``path:line:function`` (null where there is none)."""

    seq: int
    t_ns: int
    device: int
    stream: int
    size: int
    rounded: int
    site: str | None
    user_site: str | None
    request_site: str | None
    handled: bool
    handler: str | None
    live_bytes: int
    reserved_bytes: int
    pool_reserved_bytes: int | None
    free_in_pool: int | None
    largest_free_block: int
    device_free: int | None
    device_free_bytes: int | None
    device_free_source: str
    diagnosis: str


class OOMJSON(OOMBriefJSON):
    """The reported ``oom``: an entry and the state at that moment; ``stack``: its frames,
    innermost first, as ``path:line:function`` (tracekit's own left out; empty: none recorded),
    at most the innermost 64 and the outermost 4: ``stack_left_out`` frames between them are
    not listed (0: ``stack`` is the whole stack)."""

    explanation: str
    top_live_sites: list[SiteBytesJSON]
    budget: dict[str, Any] | None
    stack: list[str]
    stack_left_out: int


class HandledJSON(TypedDict):
    """A ``handled_by`` entry: handled OOMs of one call-site (label), who handled them, how many,
    the first requests (rounded bytes, seq order)."""

    site: str | None
    user_site: str | None
    request_site: str | None
    handler: str | None
    count: int
    sizes: list[int]


@dataclass(frozen=True)
class OOMReport:
    """One failing request (an ``oom`` row) and the state of its device's memory when it failed.

    ``device_free`` is the device's free memory at that moment and ``device_free_source``
    says how it was had: ``measured`` (cudaMemGetInfo at the OOM), ``derived`` (free at
    start − the pool's growth; it assumes nothing else took memory) or ``unknown``.
    ``handled``: the program survived it (see ``tracekit.trace.outcome``).
    """

    seq: int
    t_ns: int
    size: int
    rounded: int
    site: str | None
    stream: int
    live_bytes: int
    reserved_bytes: int
    free_in_pool: int
    largest_free_block: int
    device_free: int | None
    diagnosis: Diagnosis
    explanation: str
    top_live_sites: tuple[SiteBytes, ...]
    device: int = 0
    handled: bool = False
    device_free_source: FreeSource = FreeSource.UNKNOWN
    budget: OOMBudget | None = None
    handler: str | None = None  # who handled it, where the call-site or a retry shows it
    user_site: str | None = None  # the user's frame of the call-site (path:line:function)
    request_site: str | None = None  # the frame that made the request
    stack: tuple[str, ...] = ()  # the frames, innermost first, capped (the detailed OOMs only)
    stack_left_out: int = 0  # frames of a deep stack not in ``stack``: between its two ends
    # the failing pool's own reserved bytes at the OOM (its counters, else its segment rows), where other
    # pools of the device held memory too (``reserved_bytes`` counts every pool's segments); None otherwise
    pool_reserved_bytes: int | None = None

    def to_dict(self) -> OOMJSON:
        return OOMJSON(
            **self.brief(), explanation=self.explanation,
            top_live_sites=[s.as_json() for s in self.top_live_sites],
            budget=self.budget.to_dict() if self.budget is not None else None, stack=list(self.stack),
            stack_left_out=self.stack_left_out)

    def brief(self) -> OOMBriefJSON:
        """The ``ooms`` list entry: what failed, where, why, and whether it was survived."""
        return OOMBriefJSON(
            seq=self.seq, t_ns=self.t_ns, device=self.device, stream=self.stream, size=self.size,
            rounded=self.rounded, site=self.site, user_site=self.user_site, request_site=self.request_site,
            handled=self.handled, handler=self.handler, live_bytes=self.live_bytes,
            reserved_bytes=self.reserved_bytes, pool_reserved_bytes=self.pool_reserved_bytes,
            free_in_pool=self.free_in_pool if self.free_in_pool >= 0 else None,  # None: see _free_row
            largest_free_block=self.largest_free_block, device_free=self.device_free,
            device_free_bytes=self.device_free, device_free_source=self.device_free_source.value,
            diagnosis=self.diagnosis.value)


@dataclass(frozen=True)
class Summary:
    """Whole-trace figures (bytes unless named; ``*_seq`` are event seq numbers)."""

    path: str | None
    events: int
    duration_s: float
    raw_device: bool
    peak_live_bytes: int
    peak_live_seq: int | None
    peak_requested_bytes: int
    peak_reserved_bytes: int
    peak_reserved_seq: int | None
    max_external_fragmentation: float
    min_largest_free_block: int | None
    jw1: float | None
    jw2: float | None
    jw3: float | None
    jw4: float | None
    oom: OOMReport | None
    oom_events: int
    leaks: tuple[SiteBytes, ...]
    leaked_bytes: int
    leaked_blocks: int
    context: DeviceContext
    skipped: tuple[str, ...] = ()
    user_code_unmatched: tuple[str, ...] = ()  # --user-code paths no frame of the trace lies under
    warnings: tuple[str, ...] = ()  # inconsistent events kept (blocks against segments)
    ooms: tuple[OOMReport, ...] = ()  # every OOM in seq order (every device's, at the top level)
    device: int | None = None  # the device these figures describe
    devices: tuple[Summary, ...] = ()  # a trace of several devices: each device's own summary
    trees: Trees | None = None  # live bytes by stack at the peak, the OOMs and the end (--tree)

    def handled_by(self) -> list[HandledJSON]:
        """Handled OOMs grouped by call-site (label): ``site``, its ``user_site`` and
        ``request_site``, ``handler`` (where it shows), ``count`` and the first requests
        (``sizes``, rounded bytes, in seq order)."""
        groups: dict[str | None, HandledJSON] = {}
        for o in self.ooms:
            if o.handled:
                g = groups.setdefault(o.site, HandledJSON(
                    site=o.site, user_site=o.user_site, request_site=o.request_site, handler=None,
                    count=0, sizes=[]))
                g["count"] += 1
                g["handler"] = g["handler"] or o.handler
                if len(g["sizes"]) < HANDLED_SIZES:
                    g["sizes"].append(o.rounded)
        return sorted(groups.values(), key=lambda g: -g["count"])

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path, "events": self.events, "duration_s": self.duration_s,
            "raw_device": self.raw_device,
            "peak_live_bytes": self.peak_live_bytes, "peak_live_seq": self.peak_live_seq,
            "peak_requested_bytes": self.peak_requested_bytes,
            "peak_reserved_bytes": self.peak_reserved_bytes, "peak_reserved_seq": self.peak_reserved_seq,
            "max_external_fragmentation": self.max_external_fragmentation,
            "min_largest_free_block": self.min_largest_free_block,
            # Reserved below requested (a negative JW) only where blocks and segments contradict.
            **{k: (x if x is None or x >= 0 else None) for k, x in
               (("jw1", self.jw1), ("jw2", self.jw2), ("jw3", self.jw3), ("jw4", self.jw4))},
            "device": self.device,
            "oom": self.oom.to_dict() if self.oom else None,
            "oom_events": self.oom_events,
            "ooms": [o.brief() for o in self.ooms],
            "handled_ooms": sum(o.handled for o in self.ooms),
            "handled_by": self.handled_by(),
            "leaks": [s.to_dict() for s in self.leaks],
            "leaked_bytes": self.leaked_bytes, "leaked_blocks": self.leaked_blocks,
        }
        d.update(self.context.to_dict())
        d["skipped_events"] = list(self.skipped)
        d["warning_events"] = list(self.warnings)
        if self.devices:
            d["devices"] = [p.to_dict() for p in self.devices]
        if self.trees is not None:
            d["trees"] = self.trees.to_dict()
        return d

    def to_text(self) -> str:
        if self.devices:
            fatal = f"; the OOM below is on device {self.device}" if self.oom else ""
            head = (f"trace  {self.path or '(in memory)'}: {len(self.devices)} devices, each analyzed on its "
                    f"own (its own pool, limit and timeline){fatal}")
            return "\n\n".join([head, *(f"== device {p.device} ==\n{p.to_text()}" for p in self.devices)])
        sz = format_size
        rows = [
            ("trace", safe_text(self.path) if self.path else "(in memory)"),
            ("events", f"{self.events:,} over {self.duration_s:.3f} s"
             + ("  (raw device: no segment rows, reserved = live)" if self.raw_device else "")),
            ("peak live", f"{sz(self.peak_live_bytes)} at seq {_opt(self.peak_live_seq)}"),
            ("peak requested", sz(self.peak_requested_bytes)),
            ("peak reserved", f"{sz(self.peak_reserved_bytes)} at seq {_opt(self.peak_reserved_seq)}"),
            ("max ext. fragm.", f"{self.max_external_fragmentation:.1%}  (1 - largest free / free)"),
            ("min largest free", sz(self.min_largest_free_block) + "  (while anything was free)"),
            ("JW #1..#4", "  ".join(_pct(x) for x in (self.jw1, self.jw2, self.jw3, self.jw4))
             + "  (reserved over requested)"),
        ]
        c = self.context
        if c.device_total is not None:
            rows.append(("device", f"{safe_text(c.device_name or 'n/a')}: total {sz(c.device_total)}, "
                         f"free at start {sz(c.free_at_start)}, overhead {sz(c.overhead)}"))
        for label, b in c.overhead_parts():
            rows.append(("  " + label, sz(b)))
            if label.endswith("context"):
                rows.extend(("", f"  of which {lab}: {sz(x)}") for lab, x in c.context_parts())
        if c.limit is not None:
            rows.append((c.limit_what, sz(c.limit)))
        if c.heap_capacity is not None:
            rows.append(("heap capacity", sz(c.heap_capacity)))
        rows.extend(self._oom_rows())
        rows.append(("still live at end", f"{sz(self.leaked_bytes)} in {self.leaked_blocks:,} blocks"))
        rows.extend(_site_rows(self.leaks))
        rows.extend(("warning", f"skipped {s}") for s in self.skipped)
        if self.warnings:
            kept = "; ".join(self.warnings)
            rows.append(("warning", f"kept inconsistent events (figures may be off): {kept}"))
        width = max(len(k) for k, _ in rows)
        text = "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)
        return text if self.trees is None else f"{text}\n\n{self.trees.to_text()}"

    def _oom_rows(self) -> list[tuple[str, str]]:
        o = self.oom
        if o is None:
            return [("out of memory", "none")]
        fate = "survived: the program went on" if o.handled else "fatal: the program died of it"
        rows = [
            ("out of memory", f"seq {o.seq} on device {o.device} ({fate}): {format_size(o.size)} "
             f"requested ({format_size(o.rounded)} rounded) at {site_text(o.site)}"),
            ("  diagnosis", o.diagnosis.value.upper()),
            ("  why", o.explanation),
            ("  live / reserved", f"{format_size(o.live_bytes)} / {format_size(o.reserved_bytes)}"
             + (f" (all pools; the failing pool's own: {format_size(o.pool_reserved_bytes)})"
                if o.pool_reserved_bytes is not None else "")),
            _free_row(o),
            _device_free_row(o),
        ]
        if o.budget is not None:
            rows.append(("  device budget", "at start -> at the OOM (change)  [how] why"))
            rows.extend(("    " + k, v) for k, v in o.budget.rows())
        rows.append(("  live by site", ""))
        rows.extend(_site_rows(o.top_live_sites))
        rows.extend(self._every_oom_rows())
        return rows

    def _every_oom_rows(self, top: int = 20) -> list[tuple[str, str]]:
        if len(self.ooms) < 2:
            return []
        handled = sum(o.handled for o in self.ooms)
        rows = [("every OOM", f"{len(self.ooms)}, of which {handled} handled and "
                 f"{len(self.ooms) - handled} fatal")]
        for h in self.handled_by():
            rows.append(("  handled at", handled_line(h)))
        for o in self.ooms[:top]:
            mark = "handled" if o.handled else "FATAL"
            rows.append(("", f"  seq {o.seq:>8} dev {o.device} {format_size(o.rounded):>11} {mark:<7} "
                         f"{o.diagnosis.value:<13} {site_text(o.site)}"))
        if len(self.ooms) > top:
            rows.append(("", f"  ... and {len(self.ooms) - top} more (--json lists them all)"))
        return rows


def handled_line(h: HandledJSON | dict[str, Any]) -> str:
    """"3 x SITE (who: 364.50 MiB, 182.25 MiB, 91.13 MiB)" for one ``handled_by`` entry."""
    shown = ", ".join(format_size(b) for b in h["sizes"]) + (", ..." if h["count"] > len(h["sizes"]) else "")
    who = f"{h['handler']}: " if h["handler"] else "requests "
    return f"{h['count']:,} x {site_text(h['site'])} ({who}{shown})"


def site_text(site: str | None) -> str:
    """A call-site for a line of text: escaped for a terminal on its own, so that no character of it
    (a newline included) acts or starts a line; "(no call-site)" for none."""
    return safe_text(site) if site is not None else "(no call-site)"


def _device_free_row(o: OOMReport) -> tuple[str, str]:
    if o.device_free_source is FreeSource.MEASURED:
        return ("  device free", f"{format_size(o.device_free)} (measured)")
    if o.device_free_source is FreeSource.DERIVED:
        return ("  device free", f"not measured; free at start - the pool's growth = "
                f"{format_size(o.device_free)} (derived: misses whatever else took memory)")
    return ("  device free", "unknown (not recorded)")


def _site_rows(sites: tuple[SiteBytes, ...], top: int = 5) -> list[tuple[str, str]]:
    """One row per call-site, bytes first so long paths do not widen the label column."""
    return [("", f"  {format_size(s.bytes):>11} in {s.blocks:>6,} blocks  {site_text(s.site)}")
            for s in sites[:top]]


def _pct(x: float | None) -> str:
    return "n/a" if x is None or x < 0 else f"{x:.1%}"  # < 0: reserved below requested, see to_dict


def ratio_over(held: float, base: float) -> float | None:
    """(held − base) / base, None when base is 0."""
    return None if base <= 0 else (held - base) / base


def _opt(x: int | None) -> str:
    return "n/a" if x is None else str(x)


def _free_row(o: OOMReport) -> tuple[str, str]:
    """Free in the pool = reserved - live; below 0 only where the trace's blocks and segments
    contradict each other (a block outside its segments, a segment freed under live blocks)."""
    free = (format_size(o.free_in_pool) if o.free_in_pool >= 0
            else "unknown (live exceeds reserved: blocks and segments of the trace contradict each other)")
    return ("  free / largest", f"{free} / {format_size(o.largest_free_block)}")
