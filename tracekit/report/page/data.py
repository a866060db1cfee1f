"""Build the page's data model (``model.PageModel``) from a trace and typed results.

The builders take the analyzer's ``AnalysisResult``, advise's ``AdviseResult`` and the what-if
search's ``WhatIfResult`` and read their fields (never a ``to_dict()`` by string key). Everything
measured comes from the analysis the report already runs: the per-event timeline (levels of
detail), the summary (peaks, every OOM with its diagnosis and device budget, leaks),
``leaks.pool_state_at`` / ``by_site`` for the call-sites at the peak, and ``report.blocks.rank_sites``
for colours. The OOMs are also grouped by outcome, call-site and handler (``oom_groups``), and the
fatal one's request is shown as the program's error named it (``request``). A trace of several
devices is drawn for the reported device (the fatal OOM's); every device's OOMs are listed.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa

from tracekit.advise.capacity import WhatIfResult
from tracekit.advise.evaluate import Outcome
from tracekit.advise.result import AdviseResult
from tracekit.advise.verdict import ORDER, WORDS
from tracekit.advise.verdict import Verdict as Judged
from tracekit.analysis.analyze import AnalysisResult
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
    Check,
    CureView,
    OOMColumns,
    OOMDetail,
    OOMGroup,
    PageModel,
    Peak,
    TableView,
    TraceInfo,
    Verdict,
)
from tracekit.report.page.request import reported_request
from tracekit.report.page.state import build_state
from tracekit.report.page.text import safe_strings
from tracekit.trace import Op, Trace
from tracekit.trace.arrow import array_of, filled, floats_of
from tracekit.trace.callsite import CallSites
from tracekit.trace.devices import device_ids, select_device
from tracekit.trace.events import seq_row
from tracekit.trace.stacks import UserCode
from tracekit.units import format_size


def device_rows(table: pa.Table, device: int | None, several: bool) -> pa.Table:
    """The analyzer's timeline rows of ``device`` (all rows for a one-device trace)."""
    if not several or device is None:
        return table
    mask = filled(table.column("device")) == device
    return table.filter(array_of(mask, pa.bool_()))


def index_of(seq_col: np.ndarray, seq: int | None) -> int | None:
    """The event index of ``seq`` in an ascending seq column (None for None or an empty column)."""
    if seq is None or len(seq_col) == 0:
        return None
    return min(seq_row(seq_col, seq), len(seq_col) - 1)


DETAILS = 1000  # OOMs (besides the reported one) whose explanation and budget the page carries


def oom_stacks(trace: Trace, stack: np.ndarray) -> dict[int, int]:
    """The stack id of every oom row of the trace (every device's), by seq."""
    oi = np.flatnonzero(trace.events.op == Op.OOM)
    return dict(zip(trace.events.seq[oi].tolist(), stack[oi].tolist(), strict=True))


GROUP_IDS = 200  # OOM ids a group lists (its count says how many in all; the table lists every one)


def oom_groups(ooms: tuple[OOMReport, ...]) -> tuple[list[OOMGroup], np.ndarray]:
    """The OOMs grouped by outcome, call-site and handler, fatal groups first, then handled groups by
    count (largest first), and each OOM's group index."""
    keys: dict[tuple[bool, str | None, str | None], list[int]] = {}
    for i, o in enumerate(ooms):
        keys.setdefault((o.handled, o.site, o.handler), []).append(i)
    order = sorted(keys, key=lambda k: (k[0], -len(keys[k]), keys[k][0]))
    group = np.zeros(len(ooms), np.int32)
    out: list[OOMGroup] = []
    for g, k in enumerate(order):
        ids = keys[k]
        group[ids] = g
        sizes = [ooms[i].rounded for i in ids]
        out.append(OOMGroup(handled=k[0], site=k[1], handler=k[2], count=len(ids), ids=ids[:GROUP_IDS],
                            rounded_min=min(sizes), rounded_max=max(sizes)))
    return out, group


def oom_columns(
    ooms: tuple[OOMReport, ...], seq_col: np.ndarray, device: int, t0: int, stack_of: dict[int, int],
    group: np.ndarray | None = None,
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
        group=column(np.zeros(len(ooms)) if group is None else group, "i32"),
        live_bytes=column(a[:, 8], "f64"),
        reserved_bytes=column(a[:, 9], "f64"),
        largest_free_block=column(a[:, 10], "f64"),
        device_free=column(a[:, 11], "f64"),
    )


def oom_details(trace: Trace, s: Summary) -> list[OOMDetail]:
    """The explanation and budget of the reported OOM and of the first ``DETAILS`` OOMs, and the request
    as the program's own error named it (the fatal one, where the trace holds the message)."""
    out = []
    for i, o in enumerate(s.ooms):
        if i >= DETAILS and o is not s.oom:
            continue
        said, why = reported_request(trace.meta.recorded.exit, o, s.context.expandable_segments)
        out.append(OOMDetail(
            id=i,
            explanation=o.explanation or None,
            handler=o.handler,
            device_free_source=o.device_free_source.value,
            budget=budget_view(o.budget, o.seq, s.context.limit, s.context.limit_what)
            if o.budget is not None else None,
            reported=said,
            reported_why=why,
        ))
    return out


def plural(n: int, word: str, words: str | None = None) -> str:
    """``1 OOM``, ``3 OOMs``: the count and the word in its number."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


JW = ("Johnstone & Wilson's fragmentation, reserved ÷ requested − 1: JW1 time-averaged / JW2 at peak "
      "requested / JW3 at peak reserved / JW4 peak reserved ÷ peak requested")


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
        ["max external fragmentation (1 − largest free block ÷ free in the pool)",
         pct(s.max_external_fragmentation)],
        [JW, " / ".join(pct(x) for x in (s.jw1, s.jw2, s.jw3, s.jw4))],
        ["OOMs", f"{plural(len(s.ooms), 'OOM')}, {handled:,} handled" if s.ooms else "none"],
        ["never freed", f"{format_size(s.leaked_bytes)} in {plural(s.leaked_blocks, 'block')}"],
    ]


def _limit_line(s: Summary) -> str:
    """What the timeline's limit line is: where several pools share the device, the failing pool's own
    limit, drawn beside the reserved bytes of every pool (``OOMReport.pool_reserved_bytes``)."""
    several = s.oom is not None and s.oom.pool_reserved_bytes is not None
    return "the failing pool's limit (reserved counts every pool)" if several else s.context.limit_what


def _verdict(trace: Trace, s: Summary) -> Verdict:
    """The verdict in one sentence with its measured numbers: the reported OOM's request (and the error's
    own figure), what the pool held against its limit, its free space and largest free block, the device
    free where measured; without an OOM, the peaks against the limit."""
    fs, ctx = format_size, s.context
    cap = f" of the {fs(ctx.limit)} {ctx.limit_what}" if ctx.limit else ""
    o = s.oom
    if o is None:
        return Verdict(diagnosis=None, explanation=None,
                       text=f"No OOM in this trace: peak live {fs(s.peak_live_bytes)}, peak reserved "
                       f"{fs(s.peak_reserved_bytes)}{cap}.")
    kind = "handled" if o.handled else "fatal"
    said = reported_request(trace.meta.recorded.exit, o, s.context.expandable_segments)[0]
    pool = "" if s.raw_device else (f", {fs(o.free_in_pool)} free in the pool, largest free block "
                                    f"{fs(o.largest_free_block)}")
    dev = f"; {fs(o.device_free)} free on the device" if o.device_free is not None else ""
    return Verdict(
        diagnosis=o.diagnosis.value,
        explanation=o.explanation or None,
        text=f"{kind} OOM at seq {o.seq} on device {o.device}: {o.diagnosis.value} "
        f"({fs(o.rounded)} requested" + (f"; the error said \u201c{said}\u201d)" if said else ")")
        + (f" with {fs(o.pool_reserved_bytes)} reserved in its pool{cap} ({fs(o.reserved_bytes)} in all "
           "pools of the device)" if o.pool_reserved_bytes is not None
           else f" with {fs(o.reserved_bytes)} reserved{cap}") + f"{pool}{dev}.",
    )


def _verdict_of(o: Outcome) -> Judged:
    return o.verdict or (Judged.FITS if o.fits else Judged.NO)


def _verified(r: AdviseResult, best: Outcome) -> str:
    """How ``best``'s verdict was had: the replay or the model, and the real run where ``--rerun`` ran it."""
    said = "replay" if best.verified_by_replay else "model"
    ran = next((x for x in r.reruns if x.setting == best.label() and x.ran), None)
    if ran is not None:
        said += ", real run: " + ("finished" if ran.finished else "failed")
    return said


def _checks(r: AdviseResult, best: Outcome) -> list[Check]:
    """Each of the three ways a verdict can be checked, done or not: the replay (or the device-allocator
    model), the device (``--verify-on-device``), a real run of the program (``--rerun``)."""
    v = _verdict_of(best).value
    out = [Check(how="replay" if best.verified_by_replay else "model", done=True,
                 said=(f"replayed: {v}" if best.verified_by_replay
                       else f"the device-allocator model, not a replay: {v}"))]
    dc = next((c for c in r.device_checks if c.setting == best.label()), None)
    if dc is None or dc.fits_on_device is None:
        why = dc.note if dc is not None and dc.note else "not checked (tracekit advise --verify-on-device N)"
        out.append(Check(how="device", done=False, said=f"on the device: {why}"))
    else:
        peak = f", peak reserved {format_size(dc.peak_reserved_on_device)}" \
            if dc.peak_reserved_on_device is not None else ""
        out.append(Check(how="device", done=True, said="on the device: " + (
            "no OOM" if dc.fits_on_device else "ran out") + peak
            + ("" if dc.agrees else " (disagrees with the replay)")))
    rr = next((x for x in r.reruns if x.setting == best.label()), None)
    if rr is None or not rr.ran:
        if rr is not None and rr.note:
            why = rr.note
        elif r.pool is not None:  # record --limit sets the default pool's limit alone
            why = (f"not run: a setting of the program's own pool {r.pool.name()} is made in the program "
                   "(advise --rerun cannot apply it); run the program with the line above")
        else:
            why = f"not run (tracekit advise {r.trace or 'TRACE'} --rerun 1)"
        out.append(Check(how="real run", done=False, said=f"real run: {why}"))
    else:
        got = ("finished" if rr.finished else "timed out" if rr.timed_out
               else f"failed (exit {rr.exit_code})")
        if rr.got_past is not None:
            got += ", got past the failing request" if rr.got_past else ", ran out at the failing request"
        if rr.real_peak is not None:
            got += f", peak reserved {format_size(rr.real_peak)}"
        if rr.overridden:
            own = f"its own limit ({format_size(rr.limit_held)})" if rr.limit_held is not None else "no limit"
            got += f"; not under this setting: the program set {own}"
        out.append(Check(how="real run", done=True, said=f"real run: {got}"))
    return out


def _cures(r: AdviseResult) -> list[CureView]:
    """The device ran out: every cure its budget shows, those of the recommendation first (none when a
    pool limit ran out: a setting is the answer then)."""
    if r.room is None:
        return []
    chosen = r.room.pick.candidate.cures if r.room.pick is not None else ()
    ordered = [*chosen, *(c for c in r.room.cures if c not in chosen)]
    return [CureView(target=c.target, returns_bytes=c.returns, how=c.how.value, when=c.when,
                     action=c.action, chosen=c in chosen) for c in ordered]


def answer_of(advise: AdviseResult | str | None) -> Answer | None:
    """The page's answer block from advise's result (None without advise): the recommended setting when
    one fits, else the best borderline one, else none (the sentence says why); how its verdict was
    checked, and the cures where the device ran out."""
    if not isinstance(advise, AdviseResult):
        return None
    r = advise
    best = (r.fits or r.borderline or (None,))[0]
    if best is None:
        return Answer(recommendation=r.recommendation(), setting=None, line=None, verdict="none",
                      headroom_bytes=None, margin_bytes=r.margin.bytes_at(r.limit) if r.margin else None,
                      margin_why=r.margin.why if r.margin else None, verified=None, checks=[],
                      scope=r.scope, cures=_cures(r), whole_run=list(r.whole_run_lines()))
    return Answer(
        recommendation=r.recommendation(),
        setting=best.label(),
        line=r.line(best.candidate, best.capacity),
        verdict=_verdict_of(best).value,
        headroom_bytes=best.headroom,
        margin_bytes=best.margin,
        margin_why=r.margin.why if r.margin else None,
        verified=_verified(r, best),
        checks=_checks(r, best),
        scope=r.scope,
        cures=_cures(r),
        whole_run=list(r.whole_run_lines()),
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
    analysis: AnalysisResult,
    name: str,
    *,
    baseline: tuple[str, Trace, AnalysisResult] | None = None,
    whatif: WhatIfResult | None = None,
    advise: AdviseResult | str | None = None,
    user_code: UserCode | None = None,
) -> PageModel:
    """The whole data model of the page for ``trace`` and its ``analysis`` (with its timeline);
    ``advise``: advise's result, or the one sentence saying why it could not run; ``user_code``: what
    counts as the user's code (default: the frames of kind USER)."""
    s = analysis.summary
    if analysis.timeline is None:
        raise ValueError("the page draws the analyzer's timeline: analyze with timeline=True")
    several = len(device_ids(trace)) > 1
    dev = s.device if s.device is not None else (device_ids(trace) or [0])[0]
    sub = select_device(trace, dev) if several else trace
    ev = sub.events
    seq_col = ev.seq
    user = user_code if user_code is not None else UserCode()
    table, all_stacks = stacks_of(trace.events)
    stack = stacks_of(ev)[1] if several else all_stacks
    t0 = int(ev.t_ns[0]) if len(ev) else 0
    details = oom_details(trace, s)
    rows = device_rows(analysis.timeline, dev, several)
    ctx = s.context
    cs = CallSites.of(table, user)  # the analyzer's labels (the same table and user code)
    frames, stacks = page_stacks(cs)
    live_index, reserved_index = index_of(seq_col, s.peak_live_seq), index_of(seq_col, s.peak_reserved_seq)
    peak = Peak(
        live_bytes=s.peak_live_bytes,
        live_seq=s.peak_live_seq,
        live_index=live_index,
        reserved_bytes=s.peak_reserved_bytes,
        reserved_seq=s.peak_reserved_seq,
        reserved_index=reserved_index,
    )
    groups, group = oom_groups(s.ooms)
    ooms = oom_columns(s.ooms, seq_col, dev, t0, oom_stacks(trace, all_stacks), group)
    tables = _site_tables(sub, stack, cs, s, live_index)
    tables += _extra_tables(whatif, advise)
    first = next((o for o in s.ooms[:DETAILS] if o.budget is not None), None)
    first_budget = None
    if first is not None and first.budget is not None:
        first_budget = budget_view(first.budget, first.seq, ctx.limit, ctx.limit_what)
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
        verdict=_verdict(trace, s),
        answer=answer_of(advise),
        facts=facts(s),
        timeline=lod.timeline(rows, s.raw_device, ctx.limit, _limit_line(s)),
        ooms=ooms,
        oom_groups=groups,
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
            [live_index, reserved_index],
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


def _site_tables(sub: Trace, stack: np.ndarray, cs: CallSites, s: Summary, k: int | None) -> list[TableView]:
    """The live bytes by call-site right after the peak (event ``k``) and the analyzer's never-freed
    blocks, both by label (``by_label``, as ``tracekit analyze`` lists them)."""
    ev = sub.events
    out = []
    if k is not None:
        st = pool_state_at(ev, sub.mate, k + 1)  # right after the peak event
        out.append(
            _site_table(
                f"Call-sites at peak live (seq {s.peak_live_seq})",
                by_label(stack[st.block_index], st.block_size, cs),
                None,
            )
        )
    out.append(
        _site_table(
            "Blocks never freed, by call-site",
            s.leaks,
            f"{format_size(s.leaked_bytes)} in {plural(s.leaked_blocks, 'block')} in all",
        )
    )
    return out


def whatif_table(w: WhatIfResult) -> TableView:
    """The smallest capacity of each policy (each device's, for a trace of several devices)."""
    parts = w.devices or (w,)
    rows: list[list[str | int | float | bool | None]] = []
    for p in parts:
        prefix = f"device {p.device}: " if w.devices else ""
        for f in p.fits:
            note = f.error or (f"no fit up to {format_size(f.searched_up_to)}"
                               if f.min_capacity is None and f.searched_up_to else "")
            rows.append([prefix + f.policy, f.min_capacity, f.overhead_ratio, note])
    bounds = "; ".join(f"device {p.device}: {format_size(p.lower_bound)}" for p in w.devices) if w.devices \
        else format_size(w.lower_bound)
    return TableView(
        title="What-if: smallest capacity per allocator",
        columns=["policy", "smallest capacity without OOM", "over the lower bound", "note"],
        kinds=["text", "bytes", "percent", "text"],
        rows=rows,
        note="lower bound (peak live bytes, 512 B rounded): " + bounds,
        link=None,
    )


def _why_not(o: Outcome, v: Judged) -> str:
    """Why a tried setting got its verdict, in a few words (the table's last column)."""
    if v == Judged.ERROR:
        return o.error or "could not be replayed"
    if v == Judged.NO:
        return "ran out in the replay" if not o.fits else "peak reserved above the limit"
    if v == Judged.BORDERLINE:
        return "gets through, headroom within the margin"
    return "gets through, headroom above the margin"


def advise_table(r: AdviseResult) -> TableView:
    """Every setting advise tried, best verdict first (advise's verdicts, never recomputed here)."""
    tried = sorted(r.tried, key=lambda o: (ORDER[_verdict_of(o)], o.peak_reserved))
    rows: list[list[str | int | float | bool | None]] = [
        [
            o.label(),
            WORDS[_verdict_of(o)],
            o.peak_reserved,
            o.headroom if o.fits else None,
            o.margin,
            o.device_allocs,
            o.device_frees,
            "replay" if o.verified_by_replay else "model",
            _why_not(o, _verdict_of(o)),
        ]
        for o in tried
    ]
    return TableView(
        title="Advise: settings that fit under the limit",
        columns=["setting", "fits", "peak reserved", "headroom", "margin", "device allocs", "device frees",
                 "checked by", "why"],
        kinds=["text", "text", "bytes", "bytes", "bytes", "int", "int", "text", "text"],
        rows=rows,
        note=" ".join([f"{r.scope}.", *(f"Note: {n}" for n in r.notes)]),
        link=None,
    )


def _extra_tables(whatif: WhatIfResult | None, advise: AdviseResult | str | None) -> list[TableView]:
    out = []
    if whatif is not None:
        out.append(whatif_table(whatif))
    if isinstance(advise, str):
        out.append(
            TableView(title="Advise", columns=[], kinds=[], rows=[], note=f"Not run: {advise}.", link=None)
        )
    elif advise is not None:
        out.append(advise_table(advise))
    return out


def baseline_view(s: Summary, rows: pa.Table, name: str, base: Trace,
                  base_analysis: AnalysisResult) -> Baseline:
    """Live and reserved of the baseline at its coarsest level of detail, and both summaries' figures."""
    bs = base_analysis.summary
    if base_analysis.timeline is None:
        raise ValueError("the baseline's analysis has no timeline")
    several = len(device_ids(base)) > 1
    brows = device_rows(base_analysis.timeline, bs.device, several)
    n = len(brows)
    b = lod.bucket_sizes(max(n, 1))[-1]
    starts = np.arange(0, n, b)

    def top(col: str) -> np.ndarray:
        y = floats_of(brows.column(col))
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
