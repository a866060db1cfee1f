"""Build the page's data model (``model.PageModel``) from a trace and the analyzer's result.

Everything measured comes from the analysis the report already runs: the per-event
timeline (levels of detail), the summary (peaks, every OOM with its diagnosis and
device budget, leaks), ``leaks.pool_state_at`` / ``by_site`` for the call-sites at the
peak, and ``report.blocks.rank_sites`` for colours. A trace of several devices is drawn
for the reported device (the fatal OOM's); every device's OOMs are listed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.analysis.leaks import SiteBytes, by_site, pool_state_at
from tracekit.analysis.summary import OOMReport, Summary
from tracekit.report import blocks as blk
from tracekit.report.page import lod
from tracekit.report.page.budget import budget_view
from tracekit.report.page.callsites import PALETTE, one_frame_stacks
from tracekit.report.page.columns import column
from tracekit.report.page.model import (
    Baseline,
    OOMView,
    PageModel,
    Peak,
    TableView,
    TraceInfo,
    Verdict,
)
from tracekit.report.page.state import build_state
from tracekit.trace import Trace
from tracekit.trace.devices import device_ids, select_device
from tracekit.units import format_size


def device_rows(table: pa.Table, device: int | None, several: bool) -> pa.Table:
    """The analyzer's timeline rows of ``device`` (all rows for a one-device trace)."""
    if not several or device is None:
        return table
    mask = table.column("device").to_numpy() == device
    return table.filter(pa.array(mask))


def index_of(seq_col: np.ndarray, seq: int | None) -> int | None:
    """The event index of ``seq`` in an ascending seq column (None for None or an empty column)."""
    if seq is None or len(seq_col) == 0:
        return None
    return min(int(np.searchsorted(seq_col, np.uint64(seq))), len(seq_col) - 1)


def _oom_view(
    i: int, o: OOMReport, seq_col: np.ndarray, device: int | None, stack_of: dict[str, int]
) -> OOMView:
    k = index_of(seq_col, o.seq) if o.device == device else None
    return OOMView(
        id=i,
        seq=o.seq,
        index=-1 if k is None else k,
        t_ns=o.t_ns,
        device=o.device,
        stream=o.stream,
        size=o.size,
        rounded=o.rounded,
        handled=o.handled,
        handler=o.handler,
        diagnosis=o.diagnosis.value,
        explanation=o.explanation or None,
        stack=stack_of.get(o.site, -1) if o.site else -1,
        live_bytes=o.live_bytes,
        reserved_bytes=o.reserved_bytes,
        largest_free_block=o.largest_free_block,
        device_free=o.device_free,
        device_free_source=o.device_free_source.value,
        budget=budget_view(o.budget, o.seq) if o.budget is not None else None,
    )


def facts(s: Summary) -> list[list[str]]:
    """The summary's headline figures as (metric, value) text rows."""

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    handled = sum(o.handled for o in s.ooms)
    return [
        ["events", f"{s.events:,}"],
        ["duration", f"{s.duration_s:.3f} s"],
        ["peak live", format_size(s.peak_live_bytes)],
        ["peak requested", format_size(s.peak_requested_bytes)],
        ["peak reserved", format_size(s.peak_reserved_bytes)],
        ["max external fragmentation", pct(s.max_external_fragmentation)],
        ["JW1 / JW2 / JW3 / JW4", " / ".join(pct(x) for x in (s.jw1, s.jw2, s.jw3, s.jw4))],
        ["OOMs (handled)", f"{len(s.ooms)} ({handled})"],
        ["never freed", f"{format_size(s.leaked_bytes)} in {s.leaked_blocks:,} blocks"],
    ]


def _verdict(s: Summary) -> Verdict:
    o = s.oom
    if o is None:
        return Verdict(diagnosis=None, explanation=None, text="No OOM in this trace.")
    kind = "handled" if o.handled else "fatal"
    return Verdict(
        diagnosis=o.diagnosis.value,
        explanation=o.explanation or None,
        text=f"{kind} OOM at seq {o.seq} on device {o.device}: {o.diagnosis.value} "
        f"({format_size(o.rounded)} requested)",
    )


def _site_table(title: str, rows: tuple[SiteBytes, ...], note: str | None) -> TableView:
    return TableView(
        title=title,
        columns=["call-site", "bytes", "blocks"],
        kinds=["text", "bytes", "int"],
        rows=[[r.site or "(no call-site)", r.bytes, r.blocks] for r in rows],
        note=note,
        link=None,
    )


def _ooms_table(views: list[OOMView], sites: tuple[str, ...]) -> TableView:
    rows: list[list[str | int | float | bool | None]] = [
        [
            v["seq"],
            v["device"],
            v["rounded"],
            "handled" if v["handled"] else "fatal",
            v["diagnosis"],
            sites[v["stack"]] if v["stack"] >= 0 else "(no call-site)",
        ]
        for v in views
    ]
    return TableView(
        title="Every OOM",
        columns=["seq", "device", "request", "outcome", "diagnosis", "call-site"],
        kinds=["int", "int", "bytes", "text", "text", "text"],
        rows=rows,
        note="Click a row to show the memory map at that OOM.",
        link="oom",
    )


def build_model(
    trace: Trace,
    analysis: Any,
    name: str,
    *,
    baseline: tuple[str, Trace, Any] | None = None,
    whatif: dict[str, Any] | None = None,
    advise: dict[str, Any] | str | None = None,
) -> PageModel:
    """The whole data model of the page for ``trace`` and its ``analysis`` (``AnalysisResult``)."""
    s: Summary = analysis.summary
    several = len(device_ids(trace)) > 1
    dev = s.device if s.device is not None else (device_ids(trace) or [0])[0]
    sub = select_device(trace, dev) if several else trace
    ev = sub.events
    seq_col = ev.seq
    stack_of = {site: i for i, site in enumerate(ev.sites)}
    views = [_oom_view(i, o, seq_col, dev, stack_of) for i, o in enumerate(s.ooms)]
    rows = device_rows(analysis.timeline, dev, several)
    ctx = s.context
    frames, stacks = one_frame_stacks(ev.sites)
    peak = Peak(
        live_bytes=s.peak_live_bytes,
        live_seq=s.peak_live_seq,
        live_index=index_of(seq_col, s.peak_live_seq),
        reserved_bytes=s.peak_reserved_bytes,
        reserved_seq=s.peak_reserved_seq,
        reserved_index=index_of(seq_col, s.peak_reserved_seq),
    )
    on_dev = np.array([v["id"] for v in views if v["index"] >= 0], np.int64)
    tables = [_ooms_table(views, ev.sites)] if views else []
    tables += _site_tables(sub, s, peak)
    tables += _extra_tables(whatif, advise)
    first_budget = next((v["budget"] for v in views if v["budget"] is not None), None)
    return PageModel(
        version=1,
        title=f"tracekit report: {name}",
        trace=TraceInfo(
            name=name,
            source=str(trace.meta.source),
            device=int(dev),
            devices=device_ids(trace),
            device_name=ctx.device_name,
            device_total=ctx.device_total,
            events=len(ev),
            duration_s=s.duration_s,
            raw_device=s.raw_device,
        ),
        verdict=_verdict(s),
        facts=facts(s),
        timeline=lod.timeline(rows, s.raw_device, ctx.limit),
        ooms=views,
        peak=peak,
        frames=frames,
        stacks=stacks,
        site_rank=[int(x) for x in blk.rank_sites(blk.blocks(sub), len(ev.sites))],
        palette=list(PALETTE),
        state=build_state(sub, [peak["live_index"], peak["reserved_index"]], on_dev),
        budget_start=first_budget,
        tables=tables,
        baseline=None if baseline is None else baseline_view(s, rows, *baseline),
    )


def _site_tables(sub: Trace, s: Summary, peak: Peak) -> list[TableView]:
    ev = sub.events
    k = peak["live_index"]
    out = []
    if k is not None:
        st = pool_state_at(ev, sub.mate, k + 1)  # right after the peak event
        out.append(
            _site_table(
                f"Call-sites at peak live (seq {peak['live_seq']})",
                by_site(st.block_site, st.block_size, ev.sites),
                None,
            )
        )
    out.append(
        _site_table(
            "Blocks never freed, by call-site",
            s.leaks,
            f"{format_size(s.leaked_bytes)} in {s.leaked_blocks:,} blocks in all",
        )
    )
    return out


def _extra_tables(whatif: dict[str, Any] | None, advise: dict[str, Any] | str | None) -> list[TableView]:
    out = []
    if whatif is not None:
        from tracekit.report.sections import whatif_rows

        out.append(
            TableView(
                title="What-if: smallest capacity per allocator",
                columns=["policy", "smallest capacity without OOM", "over the lower bound", "note"],
                kinds=["text", "bytes", "percent", "text"],
                rows=[
                    [r["policy"], r["capacity_bytes"], r["overhead"], r["note"]] for r in whatif_rows(whatif)
                ],
                note="lower bound (peak live bytes, 512 B rounded): "
                + format_size(whatif.get("lower_bound_bytes")),
                link=None,
            )
        )
    if isinstance(advise, str):
        out.append(
            TableView(title="Advise", columns=[], kinds=[], rows=[], note=f"Not run: {advise}.", link=None)
        )
    elif advise is not None:
        tried = sorted(advise["tried"], key=lambda r: (not r["fits"], r["peak_reserved_bytes"]))
        out.append(
            TableView(
                title="Advise: settings that fit under the limit",
                columns=[
                    "setting",
                    "fits",
                    "peak reserved",
                    "headroom",
                    "device allocs",
                    "device frees",
                    "checked by",
                ],
                kinds=["text", "bool", "bytes", "bytes", "int", "int", "text"],
                rows=[
                    [
                        r["setting"],
                        bool(r["fits"]),
                        r["peak_reserved_bytes"],
                        r["headroom_bytes"] if r["fits"] else None,
                        r["device_allocs"],
                        r["device_frees"],
                        "replay" if r["verified_by_replay"] else "model",
                    ]
                    for r in tried
                ],
                note=" ".join([f"Recommendation. {advise['recommendation']}", f"{advise['scope']}.",
                               *(f"Note: {n}" for n in advise.get("notes", ()))]),
                link=None,
            )
        )
    return out


def baseline_view(s: Summary, rows: pa.Table, name: str, base: Trace, base_analysis: Any) -> Baseline:
    """Live and reserved of the baseline at its coarsest level of detail, and both summaries' figures."""
    bs: Summary = base_analysis.summary
    several = len(device_ids(base)) > 1
    brows = device_rows(base_analysis.timeline, bs.device, several)
    n = len(brows)
    b = lod.bucket_sizes(max(n, 1))[-1]
    starts = np.arange(0, n, b)

    def top(col: str) -> np.ndarray:
        y = np.asarray(brows.column(col).to_numpy(zero_copy_only=False), np.float64)
        return np.fmax.reduceat(y, starts) if n else y

    mine, theirs = facts(s), facts(bs)
    return Baseline(
        name=name,
        n=n,
        bucket=b,
        live=column(top("live_bytes"), "f32"),
        reserved=column(top("reserved_bytes"), "f32"),
        summary=[[a[0], a[1], c[1]] for a, c in zip(mine, theirs, strict=True)],
    )
