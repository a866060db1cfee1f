"""``analyze_trace``: timeline, summary, OOM verdict and leaks of one trace.

The sequential part (running sums, the largest free block) is one compiled
pass; everything else is NumPy over whole columns: the state at the OOM is
rebuilt with masks over the malloc/free pairing, leaks are the mallocs that
were never freed, grouped by call-site. A call-site is the label of an event's stack
(``tracekit.trace.callsite``: the user's line and the library line that made the request),
computed once per distinct stack; ``trees`` adds the live bytes by whole stack
(``tracekit.analysis.tree``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa

from tracekit import progress
from tracekit.analysis import largest_free as lf
from tracekit.analysis.context import DeviceContext, device_context_for
from tracekit.analysis.diagnosis import OOMFacts, diagnose
from tracekit.analysis.fatal import handler, retried_smaller
from tracekit.analysis.leaks import PoolState, SiteBytes, by_label, leaks, pool_state_at
from tracekit.analysis.oom_budget import FreeSource, Moment, oom_budget
from tracekit.analysis.recording import OOMState, StartState, extra_column, start_state
from tracekit.analysis.summary import OOMReport, Summary, ratio_over
from tracekit.analysis.timeline import ScanResult, scan_events, timeline_table
from tracekit.analysis.tree import TreeInputs, TreeLimits, trees_of
from tracekit.inputs import safe_text
from tracekit.sim.torch_rules import segment_sizes
from tracekit.trace.arrow import array_of, filled
from tracekit.trace.callsite import CallSites, StackEnds, frame_text, stack_ids, stack_table, unmatched
from tracekit.trace.devices import device_ids, split_devices
from tracekit.trace.events import Events, segment_delta
from tracekit.trace.outcome import fatal_seq, is_own_pool, pool_entry
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op, Source
from tracekit.trace.stacks import UserCode

TOP_SITES = 10
DETAILED = 64  # OOMs (besides the reported one) that get a pool-state rebuild and a device budget
MiB = 1 << 20
TORCH_SMALL_REQUEST = MiB  # PyTorch serves requests <= 1 MiB from 2 MiB small-pool segments
TORCH_SMALL_SEGMENT = 2 * MiB


def torch_segment_size(rounded: int) -> int:
    """The segment PyTorch's caching allocator cudaMallocs for a request it cannot place
    (the simulator's ``segment_sizes``: 2 MiB for <= 1 MiB, 20 MiB below 10 MiB, else 2 MiB multiples)."""
    return int(segment_sizes(np.array([rounded], np.int64))[0])


@dataclass(frozen=True, eq=False)
class AnalysisResult:
    """``summary`` always; ``timeline`` (one row per event) when asked for."""

    summary: Summary
    timeline: pa.Table | None


@dataclass(frozen=True, eq=False)
class _Asked:
    """What every device's analysis shares: the trace's call-sites, and the tree limits (None: no trees)."""

    sites: CallSites
    trees: TreeLimits | None


def analyze_trace(trace: Trace, *, timeline: bool = True, user_code: UserCode = UserCode(),
                  trees: TreeLimits | None = None) -> AnalysisResult:
    """Analyze a trace, each device on its own; ``timeline=False`` keeps memory to the summary's needs.

    A trace of several devices gives one summary per device (``Summary.devices``); the
    top-level figures are those of the device of the reported OOM (the fatal one, else the
    first), or of the device with the highest peak reserved; ``ooms`` lists every device's.
    ``user_code``: what counts as the user's code in call-site labels; ``trees``: also the
    live bytes by stack at the peak, the OOMs and the end, under those limits.
    """
    table = stack_table(trace.events)
    result = _analyze_devices(trace, timeline, _Asked(CallSites.of(table, user_code), trees))
    misses = unmatched(table, user_code)
    return replace(result, summary=replace(result.summary, user_code_unmatched=misses)) if misses else result


def _analyze_devices(trace: Trace, timeline: bool, asked: _Asked) -> AnalysisResult:
    """Each device on its own (``asked`` once: the devices share it), combined."""
    devs = device_ids(trace)
    fatal = fatal_seq(trace.events, trace.meta.recorded)
    if len(devs) <= 1:
        return _analyze_device(trace, timeline, devs[0] if devs else 0, True, fatal, asked)
    home = trace.meta.recorded.home_device(devs)
    parts = []
    for i, (d, sub) in enumerate(split_devices(_with_extras(trace))):
        with progress.part(i, len(devs)):
            parts.append(_analyze_device(sub, timeline, d, d == home, fatal, asked))
    return _combine(parts)


def _with_extras(trace: Trace) -> Trace:
    """``trace`` holding the extra columns a device's analysis reads, read from the file once:
    without them every device would read its file again (32,768 devices: 65,536 reads)."""
    if trace.extras is not None or trace.path is None:
        return trace
    cols = {n: c for n in ("device_free", "pool") if (c := extra_column(trace, n)) is not None}
    return replace(trace, extras=pa.table(cols) if cols else pa.table({"_": pa.nulls(0)}).drop_columns(["_"]))


def _combine(parts: list[AnalysisResult]) -> AnalysisResult:
    sums = [p.summary for p in parts]
    ooms = tuple(sorted((o for s in sums for o in s.ooms), key=lambda o: o.seq))
    top = next((o for o in ooms if not o.handled), ooms[0] if ooms else None)
    main = next((s for s in sums if top is not None and s.device == top.device), None)
    if main is None:
        main = max(sums, key=lambda s: s.peak_reserved_bytes)
    summary = replace(main, oom=top, ooms=ooms, oom_events=len(ooms), devices=tuple(sums))
    tables = [p.timeline for p in parts if p.timeline is not None]
    table = None
    if len(tables) == len(parts):
        joined = pa.concat_tables(tables)
        table = joined.take(array_of(np.argsort(filled(joined.column("seq")), kind="stable"), pa.int64()))
    return AnalysisResult(summary=summary, timeline=table)


def _analyze_device(trace: Trace, timeline: bool, device: int, home: bool, fatal: int | None,
                    asked: _Asked) -> AnalysisResult:
    ev, mate = trace.events, trace.mate
    ctx = device_context_for(trace.meta, device, home)
    ooms = np.flatnonzero(ev.op == Op.OOM)
    free_col = extra_column(trace, "device_free")
    measured = np.flatnonzero(free_col >= 0) if free_col is not None else np.zeros(0, np.int64)
    probes = np.union1d(ooms, measured).astype(np.int64)
    scan = scan_events(ev, mate, want=timeline, probes=probes, merge_adjacent=ctx.expandable_segments)
    progress.report(2, 3)  # the compiled scan is most of the work; the timeline table the rest
    table = timeline_table(ev, scan, ctx.free_at_start, free_col) if timeline else None
    progress.report(3, 3)
    pools = extra_column(trace, "pool")
    marked = pools[pools >= 0] if pools is not None else np.zeros(0, np.int64)
    at = _Probed(probes, scan.probed, measured, free_col, pools,
                 several_pools=bool(len(marked)) and int(marked.min()) != int(marked.max()))
    start = start_state(trace.meta.recorded, ctx.device_total, ctx.free_at_start) if home else None
    states = trace.meta.recorded.oom_states
    sites = _Sites(asked.sites, stack_ids(ev))
    reports = []
    for n, k in enumerate(ooms):
        lead = n == 0 or (fatal is not None and int(ev.seq[k]) == fatal)
        detail = lead or n < DETAILED
        reports.append(_oom_report(trace, scan, ctx, int(k), at, start, states, device, fatal, detail, lead,
                                   sites))
    oom = next((r for r in reports if not r.handled), reports[0] if reports else None)
    summary = _summary(trace, scan, ctx, oom, len(ooms), sites)
    if asked.trees is not None:
        peak = int(scan.stats[lf.PEAK_LIVE_IDX])
        inputs = TreeInputs(ev, mate, sites.stack, sites.cs.table, sites.cs.roles)
        trees = trees_of(inputs, peak if peak >= 0 else None,
                         [(int(k), r.handled) for k, r in zip(ooms, reports, strict=True)], asked.trees)
        summary = replace(summary, trees=trees)
    return AnalysisResult(summary=replace(summary, ooms=tuple(reports), device=device), timeline=table)


@dataclass(frozen=True, eq=False)
class _Sites:
    """One device's events by call-site: each event's stack id and its label id (int32)."""

    cs: CallSites
    stack: np.ndarray
    label: np.ndarray
    _request_text: dict[int, str]

    def __init__(self, cs: CallSites, stack: np.ndarray) -> None:
        object.__setattr__(self, "cs", cs)
        object.__setattr__(self, "stack", stack)
        object.__setattr__(self, "label", cs.of_events(stack))
        object.__setattr__(self, "_request_text", {})

    def request_text(self, stack: int) -> str | None:
        """The text of the frames that made the request (once per distinct stack): who handled it."""
        if stack < 0:
            return None
        if stack not in self._request_text:
            self._request_text[stack] = " ".join(frame_text(f) for f in self.cs.request_side(stack))
        return self._request_text[stack]


@dataclass(frozen=True, eq=False)
class _Probed:
    """The scan's state after the probed rows, and the device free measured at rows."""

    probes: np.ndarray
    values: np.ndarray
    measured: np.ndarray
    free_col: np.ndarray | None
    pool_col: np.ndarray | None = None
    several_pools: bool = False  # ``pool_col`` marks rows of more than one pool (known once, not per OOM)

    def row(self, k: int) -> np.ndarray:
        return self.values[int(np.searchsorted(self.probes, k))]

    def points(self, ev: Events, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(seq, free, reserved after) of the measured rows up to and including row k."""
        rows = self.measured[self.measured <= k]
        if self.free_col is None or len(rows) == 0:
            z = np.zeros(0, np.int64)
            return z, z, z
        res = self.values[np.searchsorted(self.probes, rows), lf.PROBE_RES]
        return ev.seq[rows].astype(np.int64), self.free_col[rows], res


def _seq(ev: Events, i: int) -> int | None:
    return int(ev.seq[i]) if i >= 0 else None


def _jw1(fs: np.ndarray) -> float | None:
    """Time-weighted (Σ H·Δt − Σ Q·Δt) / Σ Q·Δt; per event when the trace has no time span."""
    if fs[lf.SUM_DT] > 0:
        return ratio_over(fs[lf.TSUM_RES], fs[lf.TSUM_REQ])
    return ratio_over(fs[lf.SUM_RES], fs[lf.SUM_REQ])


def _summary(trace: Trace, scan: ScanResult, ctx: DeviceContext, oom: OOMReport | None,
             n_ooms: int, sites: _Sites) -> Summary:
    ev, st, fs = trace.events, scan.stats, scan.fstats
    n = len(ev)
    peak_req = int(st[lf.PEAK_REQ])
    peak_res = int(st[lf.PEAK_RES])
    never_freed = (ev.op == Op.MALLOC) & (trace.mate < 0)
    min_lfb = int(st[lf.MIN_LFB_FREE])
    return Summary(
        path=str(trace.path) if trace.path else None,
        events=n,
        duration_s=float(ev.t_ns[-1] - ev.t_ns[0]) / 1e9 if n else 0.0,
        raw_device=not scan.pooled,
        peak_live_bytes=int(st[lf.PEAK_LIVE]),
        peak_live_seq=_seq(ev, int(st[lf.PEAK_LIVE_IDX])),
        peak_requested_bytes=peak_req,
        peak_reserved_bytes=peak_res,
        peak_reserved_seq=_seq(ev, int(st[lf.PEAK_RES_IDX])),
        max_external_fragmentation=float(fs[lf.MAX_FRAG]),
        min_largest_free_block=min_lfb if min_lfb >= 0 else None,
        jw1=_jw1(fs),
        jw2=ratio_over(int(st[lf.RES_AT_PEAK_REQ]), peak_req),
        jw3=ratio_over(peak_res, int(st[lf.REQ_AT_PEAK_RES])),
        jw4=ratio_over(peak_res, peak_req),
        oom=oom,
        oom_events=n_ooms,
        leaks=leaks(ev, trace.mate, sites.stack, sites.cs),
        leaked_bytes=int(ev.rounded[never_freed].sum()),
        leaked_blocks=int(np.count_nonzero(never_freed)),
        context=ctx,
        skipped=tuple(i.describe() for i in trace.issues),
        warnings=tuple(i.describe() for i in trace.warnings),
    )


def _oom_report(trace: Trace, scan: ScanResult, ctx: DeviceContext, k: int, at: _Probed,
                start: StartState | None, states: Mapping[int, OOMState], device: int, fatal: int | None,
                detail: bool, lead: bool, sites: _Sites) -> OOMReport:
    """The verdict at the OOM row k; ``detail``: the largest free block the request could use
    is found per stream and pool (else the largest of all); ``lead``: list the top call-sites."""
    ev = trace.events
    seq = int(ev.seq[k])
    request = int(ev.rounded[k])
    p = at.row(k)
    live, reserved, lfb = int(p[lf.PROBE_LIVE]), int(p[lf.PROBE_RES]), int(p[lf.PROBE_LFB])
    torch = trace.meta.source == Source.TORCH or _replays(ctx.replay_policy) == Source.TORCH
    segment = torch_segment_size(request) if torch and not ctx.expandable_segments else request
    usable = lfb
    top: tuple[SiteBytes, ...] = ()
    if detail and (scan.pooled or lead):
        state = pool_state_at(ev, trace.mate, k)
        if scan.pooled:
            usable = _usable(state, int(ev.stream[k]), request, torch and not ctx.expandable_segments,
                             ctx.expandable_segments)
        if lead:
            top = by_label(sites.stack[state.block_index], state.block_size, sites.cs, TOP_SITES)
    st = states.get(seq)
    column = int(at.free_col[k]) if at.free_col is not None and at.free_col[k] >= 0 else None
    # The budget at the OOM needs the device measured there (format v2); without it the
    # start's figures alone would say nothing about the moment.
    budget = None
    if detail and st is not None:
        budget = oom_budget(Moment(seq, reserved, live, start, st, column, at.points(ev, k)))
    if budget is not None:
        dev_free, source = budget.free, budget.free_source
    elif column is not None or (st is not None and st.mem_free is not None):
        dev_free, source = (st.mem_free if st is not None and st.mem_free is not None else column), \
            FreeSource.MEASURED
    elif ctx.free_at_start is not None:
        dev_free, source = ctx.free_at_start - reserved, FreeSource.DERIVED
    else:
        dev_free, source = None, FreeSource.UNKNOWN
    if ctx.replay_policy is None:
        ctx = replace(ctx, limit=_pool_limit(trace, k, device, st, ctx.limit, at.pool_col))
    own_reserved = _pool_reserved(ev, k, st, reserved, at, detail)
    facts = OOMFacts(request=request, segment=segment, live=live, reserved=reserved, largest_free=lfb,
                     usable_largest_free=usable, device_free=dev_free, raw_device=not scan.pooled,
                     device=device, free_measured=source is FreeSource.MEASURED,
                     pool_reserved=st.pool_total if st is not None and st.pool_total is not None
                     else own_reserved,
                     own_pool=_own_pool(trace, k, device, at.pool_col),
                     takers=budget.takers if budget is not None else "")
    diagnosis, explanation = diagnose(facts, ctx)
    cs, label, stack = sites.cs, int(sites.label[k]), int(sites.stack[k])
    ends = cs.ends(stack) if detail else StackEnds((), (), 0)
    return OOMReport(
        seq=seq, t_ns=int(ev.t_ns[k]), size=int(ev.size[k]), rounded=request,
        site=cs.name(label), stream=int(ev.stream[k]), live_bytes=live, reserved_bytes=reserved,
        free_in_pool=reserved - live, largest_free_block=lfb, device_free=dev_free,
        diagnosis=diagnosis, explanation=explanation, top_live_sites=top, device=device,
        handled=fatal is None or seq != fatal, device_free_source=source, budget=budget,
        handler=handler(sites.request_text(stack), detail and retried_smaller(ev, k, sites.label)),
        user_site=cs.user_site(label), request_site=cs.request_site(label),
        stack=tuple(frame_text(f) for f in ends.inner + ends.outer), stack_left_out=ends.left_out,
        pool_reserved_bytes=own_reserved,
    )


def _pool_reserved(ev: Events, k: int, st: OOMState | None, reserved: int, at: _Probed,
                   detail: bool) -> int | None:
    """The failing pool's own reserved bytes at OOM row k, where the trace marks more than one pool and
    they differ from every pool's (``reserved``): measured at the OOM (the pool's counters), else, for a
    detailed OOM, its own segment rows summed to k; None otherwise."""
    pools = at.pool_col
    if pools is None or pools[k] < 0 or not at.several_pools:
        return None
    if st is not None and st.pool_total is not None:
        own = st.pool_total
    elif detail:
        mine = pools[: k + 1] == pools[k]
        own = int(segment_delta(ev.take(np.flatnonzero(mine))).sum())
    else:
        return None
    return own if own != reserved else None


def _own_pool(trace: Trace, k: int, device: int, pools: np.ndarray | None) -> str:
    """Row k's pool, named, where the program made it (``trace.outcome.is_own_pool``): "the
    program's own pool 'user 1' (pool 1)"; empty for the default pool or where no pool is marked."""
    if pools is None or pools[k] < 0:
        return ""
    pool, recorded = int(pools[k]), trace.meta.recorded
    if not is_own_pool(recorded, pool, device):
        return ""
    label = entry.label if (entry := pool_entry(recorded, pool, device)) is not None else None
    return f"the program's own pool {safe_text(repr(label))} (pool {pool})" if label else \
        f"the program's own pool {pool}"


def _pool_limit(trace: Trace, k: int, device: int, st: OOMState | None, default: int | None,
                pools: np.ndarray | None) -> int | None:
    """The limit of the pool the OOM row k belongs to: measured at the OOM, else the ``pools``
    entry of the row's ``pool`` column, else the device's default."""
    if st is not None and st.pool_limit is not None:
        return st.pool_limit
    table = trace.meta.recorded.pool_limits
    if pools is not None and pools[k] >= 0 and (device, int(pools[k])) in table:
        return table[(device, int(pools[k]))]
    return default


def _replays(policy: str | None) -> Source | None:
    """The recorded allocator a replay's policy models (registry trait), None if unknown."""
    from tracekit.sim import policies as registry

    t = registry.traits(policy) if policy is not None else None
    return t.reproduces if t is not None else None


def _usable(state: PoolState, stream: int, request: int, torch_pools: bool, merge: bool) -> int:
    """The largest free gap on the request's stream (and, for PyTorch, in its small or large pool)."""
    seg, _, length = state.gaps(merge)
    ok = state.seg_stream[seg] == stream
    if torch_pools:
        small = state.seg_size[seg] == TORCH_SMALL_SEGMENT
        ok &= small if request <= TORCH_SMALL_REQUEST else ~small
    return int(length[ok].max()) if ok.any() else 0
