"""``analyze_trace``: timeline, summary, OOM verdict and leaks of one trace.

The sequential part (running sums, the largest free block) is one compiled
pass; everything else is NumPy over whole columns: the state at the OOM is
rebuilt with masks over the malloc/free pairing, leaks are the mallocs that
were never freed, grouped by call-site.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tracekit.analysis import largest_free as lf
from tracekit.analysis.context import DeviceContext, device_context
from tracekit.analysis.diagnosis import OOMFacts, diagnose
from tracekit.analysis.leaks import by_site, leaks, pool_state_at
from tracekit.analysis.summary import OOMReport, Summary, ratio_over
from tracekit.analysis.timeline import ScanResult, scan_events, timeline_table
from tracekit.sim.policies._torch_config import segment_sizes
from tracekit.trace.events import Events
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op, Source

TOP_SITES = 10
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


def analyze_trace(trace: Trace, *, timeline: bool = True) -> AnalysisResult:
    """Analyze a trace; ``timeline=False`` keeps memory to the summary's needs."""
    ev, mate = trace.events, trace.mate
    ctx = device_context(trace.meta)
    ooms = np.flatnonzero(ev.op == Op.OOM)
    probe = int(ooms[0]) if len(ooms) else -1
    scan = scan_events(ev, mate, want=timeline, probe=probe, merge_adjacent=ctx.expandable_segments)
    table = timeline_table(ev, scan, ctx.free_at_start) if timeline else None
    oom = _oom_report(trace, scan, ctx, probe) if probe >= 0 else None
    summary = _summary(trace, scan, ctx, oom, len(ooms))
    return AnalysisResult(summary=summary, timeline=table)


def _seq(ev: Events, i: int) -> int | None:
    return int(ev.seq[i]) if i >= 0 else None


def _jw1(fs: np.ndarray) -> float | None:
    """Time-weighted (Σ H·Δt − Σ Q·Δt) / Σ Q·Δt; per event when the trace has no time span."""
    if fs[lf.SUM_DT] > 0:
        return ratio_over(fs[lf.TSUM_RES], fs[lf.TSUM_REQ])
    return ratio_over(fs[lf.SUM_RES], fs[lf.SUM_REQ])


def _summary(trace: Trace, scan: ScanResult, ctx: DeviceContext, oom: OOMReport | None,
             n_ooms: int) -> Summary:
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
        leaks=leaks(ev, trace.mate),
        leaked_bytes=int(ev.rounded[never_freed].sum()),
        leaked_blocks=int(np.count_nonzero(never_freed)),
        context=ctx,
        skipped=tuple(i.describe() for i in trace.issues),
    )


def _oom_report(trace: Trace, scan: ScanResult, ctx: DeviceContext, k: int) -> OOMReport:
    ev, st = trace.events, scan.stats
    state = pool_state_at(ev, trace.mate, k)
    request = int(ev.rounded[k])
    live, reserved, lfb = int(st[lf.PROBE_LIVE]), int(st[lf.PROBE_RES]), int(st[lf.PROBE_LFB])
    usable = lfb
    torch = trace.meta.source == Source.TORCH or ctx.replay_policy == "torch"
    segment = torch_segment_size(request) if torch and not ctx.expandable_segments else request
    if scan.pooled:
        seg, _, length = state.gaps(ctx.expandable_segments)
        ok = state.seg_stream[seg] == ev.stream[k]
        if torch and not ctx.expandable_segments:
            small = state.seg_size[seg] == TORCH_SMALL_SEGMENT
            ok &= small if request <= TORCH_SMALL_REQUEST else ~small
        usable = int(length[ok].max()) if ok.any() else 0
    dev_free = ctx.free_at_start - reserved if ctx.free_at_start is not None else None
    facts = OOMFacts(request=request, segment=segment, live=live, reserved=reserved, largest_free=lfb,
                     usable_largest_free=usable, device_free=dev_free, raw_device=not scan.pooled)
    diagnosis, explanation = diagnose(facts, ctx)
    return OOMReport(
        seq=int(ev.seq[k]), t_ns=int(ev.t_ns[k]), size=int(ev.size[k]), rounded=request,
        site=ev.site_name(k), stream=int(ev.stream[k]), live_bytes=live, reserved_bytes=reserved,
        free_in_pool=reserved - live, largest_free_block=lfb, device_free=dev_free,
        diagnosis=diagnosis, explanation=explanation,
        top_live_sites=by_site(state.block_site, state.block_size, ev.sites, TOP_SITES),
    )
