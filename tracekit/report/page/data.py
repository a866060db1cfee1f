"""Build the page's data model (``model.PageModel``) from a trace and the analyzer's result.

Everything measured comes from the analysis the report already runs: the per-event
timeline (levels of detail), the summary (peaks, every OOM with its diagnosis and
device budget, leaks), ``leaks.pool_state_at`` / ``by_site`` for the call-sites at the
peak, and ``report.blocks.rank_sites`` for colours. A trace of several devices is drawn
for the reported device (the fatal OOM's); every device's OOMs are listed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.analysis.leaks import SiteBytes, by_label, pool_state_at
from tracekit.analysis.summary import OOMReport, Summary
from tracekit.report import blocks as blk
from tracekit.report.page import lod
from tracekit.report.page.budget import budget_view
from tracekit.report.page.callsites import PALETTE, page_stacks, stacks_of
from tracekit.report.page.columns import column
from tracekit.report.page.model import (
    Answer,
    Baseline,
    OOMColumns,
    OOMDetail,
    PageModel,
    Peak,
    TableView,
    TraceInfo,
    Verdict,
)
from tracekit.report.page.state import build_state
from tracekit.report.page.text import safe_strings
from tracekit.trace import Op, Trace
from tracekit.trace.callsite import CallSites
from tracekit.trace.devices import device_ids, select_device
from tracekit.trace.stacks import UserCode
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


DETAILS = 1000  # OOMs (besides the reported one) whose explanation and budget the page carries


def oom_stacks(trace: Trace, stack: np.ndarray) -> dict[int, int]:
    """The stack id of every oom row of the trace (every device's), by seq."""
    oi = np.flatnonzero(trace.events.op == Op.OOM)
    return dict(zip(trace.events.seq[oi].tolist(), stack[oi].tolist(), strict=True))


def oom_columns(
    ooms: tuple[OOMReport, ...], seq_col: np.ndarray, device: int, t0: int, stack_of: dict[int, int]
) -> OOMColumns:
    """Every OOM as columns: one pass over the analyzer's reports into a float64 table (exact: bytes,
    seq and ns are below 2^53), then one column per field; ``stack_of``: the stack id by the OOM's seq."""
    names = sorted({o.diagnosis.value for o in ooms})
    code = {n: i for i, n in enumerate(names)}
    rows = [
        (
            o.seq,
            o.device,
            o.t_ns - t0,
            o.size,
            o.rounded,
            o.handled,
            code[o.diagnosis.value],
            stack_of.get(o.seq, -1),
            o.live_bytes,
            o.reserved_bytes,
            o.largest_free_block,
            -1 if o.device_free is None else o.device_free,
        )
        for o in ooms
    ]
    a = np.array(rows, np.float64).reshape(len(rows), 12)
    seq, dev = a[:, 0].astype(np.uint64), a[:, 1].astype(np.int64)
    k = np.minimum(np.searchsorted(seq_col, seq), max(len(seq_col) - 1, 0))
    index = np.where(dev == device, k, -1) if len(seq_col) else np.full(len(ooms), -1)
    return OOMColumns(
        count=len(ooms),
        seq=column(a[:, 0], "f64", delta=True),
        index=column(index, "i32"),
        t_ns=column(a[:, 2], "f64"),
        device=column(dev, "i32"),
        size=column(a[:, 3], "f64"),
        rounded=column(a[:, 4], "f64"),
        handled=column(a[:, 5], "u8"),
        diagnosis=column(a[:, 6], "u8"),
        diagnoses=names,
        stack=column(a[:, 7], "i32"),
        live_bytes=column(a[:, 8], "f64"),
        reserved_bytes=column(a[:, 9], "f64"),
        largest_free_block=column(a[:, 10], "f64"),
        device_free=column(a[:, 11], "f64"),
    )


def oom_details(s: Summary) -> list[OOMDetail]:
    """The explanation and budget of the reported OOM and of the first ``DETAILS`` OOMs."""
    return [
        OOMDetail(
            id=i,
            explanation=o.explanation or None,
            handler=o.handler,
            device_free_source=o.device_free_source.value,
            budget=budget_view(o.budget, o.seq) if o.budget is not None else None,
        )
        for i, o in enumerate(s.ooms)
        if i < DETAILS or o is s.oom
    ]


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


def answer_of(advise: dict[str, Any] | str | None) -> Answer | None:
    """The page's answer block from ``advise --json`` output (None without advise): the recommended
    setting when one fits, else the best borderline one, else none (the sentence says why)."""
    if not isinstance(advise, dict):
        return None
    best = (advise["fits"] or advise.get("borderline") or [None])[0]
    margin = advise.get("margin") or {}
    reruns = advise.get("reruns") or []
    ran = next((r for r in reruns if best is not None and r["setting"] == best["setting"] and r["ran"]), None)
    verified = None
    if best is not None:
        verified = "replay" if best["verified_by_replay"] else "model"
        if ran is not None:
            verified += ", real run: " + ("finished" if ran["finished"] else "failed")
    return Answer(
        recommendation=advise["recommendation"],
        setting=best["setting"] if best else None,
        line=best.get("line") if best else None,
        verdict=best["verdict"] if best else "none",
        headroom_bytes=best["headroom_bytes"] if best else None,
        margin_bytes=best.get("margin_bytes") if best else margin.get("bytes_at_limit"),
        margin_why=margin.get("why"),
        verified=verified,
        scope=advise["scope"],
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


def build_model(
    trace: Trace,
    analysis: Any,
    name: str,
    *,
    baseline: tuple[str, Trace, Any] | None = None,
    whatif: dict[str, Any] | None = None,
    advise: dict[str, Any] | str | None = None,
    user_code: UserCode | None = None,
) -> PageModel:
    """The whole data model of the page for ``trace`` and its ``analysis`` (``AnalysisResult``);
    ``user_code``: what counts as the user's code (default: the frames of kind USER)."""
    s: Summary = analysis.summary
    several = len(device_ids(trace)) > 1
    dev = s.device if s.device is not None else (device_ids(trace) or [0])[0]
    sub = select_device(trace, dev) if several else trace
    ev = sub.events
    seq_col = ev.seq
    user = user_code if user_code is not None else UserCode()
    table, all_stacks = stacks_of(trace.events)
    stack = stacks_of(ev)[1] if several else all_stacks
    t0 = int(ev.t_ns[0]) if len(ev) else 0
    details = oom_details(s)
    rows = device_rows(analysis.timeline, dev, several)
    ctx = s.context
    cs = CallSites.of(table, user)  # the analyzer's labels (the same table and user code)
    frames, stacks = page_stacks(cs)
    peak = Peak(
        live_bytes=s.peak_live_bytes,
        live_seq=s.peak_live_seq,
        live_index=index_of(seq_col, s.peak_live_seq),
        reserved_bytes=s.peak_reserved_bytes,
        reserved_seq=s.peak_reserved_seq,
        reserved_index=index_of(seq_col, s.peak_reserved_seq),
    )
    ooms = oom_columns(s.ooms, seq_col, dev, t0, oom_stacks(trace, all_stacks))
    tables = _site_tables(sub, stack, cs, s, peak)
    tables += _extra_tables(whatif, advise)
    first_budget = next((d["budget"] for d in details if d["budget"] is not None), None)
    return safe_strings(PageModel(
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
        answer=answer_of(advise),
        facts=facts(s),
        timeline=lod.timeline(rows, s.raw_device, ctx.limit),
        ooms=ooms,
        oom_details=details,
        peak=peak,
        frames=frames,
        stacks=stacks,
        user_code=list(user.prefixes),
        label_rank=label_rank(sub, cs.of_events(stack), len(cs.labels)),
        palette=list(PALETTE),
        state=build_state(
            sub,
            stack,
            [peak["live_index"], peak["reserved_index"]],
            np.fromiter((o.seq for o in s.ooms), np.uint64, len(s.ooms)),
        ),
        budget_start=first_budget,
        tables=tables,
        baseline=None if baseline is None else baseline_view(s, rows, *baseline),
    ))  # every text from the trace escaped as the terminal verbs print it (page.text)


def label_rank(sub: Trace, label: np.ndarray, n_labels: int) -> list[int]:
    """Label ids by bytes x lifetime of their blocks, largest first (``blocks.rank_sites`` by label;
    ``label``: each event's label id, -1 none)."""
    b = blk.blocks(sub)
    return [int(x) for x in blk.rank_sites(dataclasses.replace(b, site=label[b.start]), n_labels)]


def _site_tables(sub: Trace, stack: np.ndarray, cs: CallSites, s: Summary, peak: Peak) -> list[TableView]:
    """The live bytes by call-site right after the peak and the analyzer's never-freed blocks, both by
    label (``by_label``, as ``tracekit analyze`` lists them)."""
    ev = sub.events
    k = peak["live_index"]
    out = []
    if k is not None:
        st = pool_state_at(ev, sub.mate, k + 1)  # right after the peak event
        out.append(
            _site_table(
                f"Call-sites at peak live (seq {peak['live_seq']})",
                by_label(stack[st.block_index], st.block_size, cs),
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
        from tracekit.advise.verdict import verdict_rows

        out.append(
            TableView(
                title="Advise: settings that fit under the limit",
                columns=[
                    "setting",
                    "fits",
                    "peak reserved",
                    "headroom",
                    "margin",
                    "device allocs",
                    "device frees",
                    "checked by",
                ],
                kinds=["text", "text", "bytes", "bytes", "bytes", "int", "int", "text"],
                rows=[
                    [
                        r["setting"],
                        word,
                        r["peak_reserved_bytes"],
                        r["headroom_bytes"] if r.get("gets_through", r["fits"]) else None,
                        r.get("margin_bytes"),
                        r["device_allocs"],
                        r["device_frees"],
                        "replay" if r["verified_by_replay"] else "model",
                    ]
                    for r, word in verdict_rows(advise)
                ],
                note=" ".join(
                    [
                        f"Recommendation. {advise['recommendation']}",
                        f"{advise['scope']}.",
                        *(f"Note: {n}" for n in advise.get("notes", ())),
                    ]
                ),
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
