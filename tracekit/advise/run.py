"""``advise(trace, ...)``: the whole search, from a read trace to an ``AdviseResult``.

The limit is ``limit`` when given, else the pool limit the trace was recorded under, else
(raw traces) the device total. Pool traces (PyTorch, CuPy) are replayed as counterfactual
input (``tracekit.advise.counterfactual``); raw traces as they are. The stages and the
pruning are those of ``tracekit.advise.search``.
"""

from __future__ import annotations

import numpy as np

from tracekit.advise.candidates import Candidate, Kind
from tracekit.advise.counterfactual import wrapped_start
from tracekit.advise.evaluate import Outcome
from tracekit.advise.result import AdviseResult, rank_key
from tracekit.advise.search import (
    Runner,
    Task,
    bisect_tasks,
    outcomes,
    single_candidates,
    stage_two,
)
from tracekit.analysis.leaks import SiteBytes, by_site
from tracekit.analysis.whatif import PolicyFit, live_curve, lower_bound
from tracekit.errors import UsageError
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op, Source
from tracekit.workers import BISECT_REPLAYS, default_jobs

TOP_SITES = 5


def trace_kind(trace: Trace) -> str:
    """``torch``, ``cupy`` or ``raw`` (synthetic traces and replays)."""
    return {Source.TORCH: "torch", Source.CUPY: "cupy"}.get(trace.meta.source, "raw")


def pick_limit(trace: Trace, limit: int | None, device_total: int | None) -> int:
    if limit is not None:
        return limit
    if trace.meta.pool_limit_bytes:
        return int(trace.meta.pool_limit_bytes)
    dev = trace.meta.device
    total = device_total or (dev.total_bytes if dev else None)
    if total:
        return int(total)
    where = f"{trace.path}: " if trace.path else ""
    raise UsageError(f"{where}the trace records no limit and no device size; give --limit SIZE")


def top_sites_at_peak(trace: Trace) -> tuple[SiteBytes, ...]:
    """Call-sites holding the most live bytes at the peak of live bytes (a failing request counts)."""
    live = live_curve(trace)
    if len(live) == 0:
        return ()
    ev, k = trace.events, int(np.argmax(live))
    idx = np.arange(len(ev))
    held = ((ev.op == Op.MALLOC) | (ev.op == Op.OOM)) & (idx <= k) & ((trace.mate < 0) | (trace.mate > k))
    b = np.flatnonzero(held)
    return by_site(ev.site[b], ev.size[b], ev.sites, TOP_SITES)


def _site_of_failure(trace: Trace) -> str | None:
    ev = trace.events
    ooms = np.flatnonzero(ev.op == Op.OOM)
    if len(ooms) == 0 or ev.site[ooms[0]] < 0:
        return None
    return ev.sites[ev.site[ooms[0]]]


def _raised_limit(fit: PolicyFit, runner: Runner, device_total: int | None) -> Outcome | None:
    """The smallest ``set_limit`` as a candidate that fits (evaluated at that limit)."""
    if fit.min_capacity is None:
        return None
    cand = Candidate(Kind.CUPY_LIMIT, "cupy")
    (o,) = outcomes(runner.map([Task(cand, fit.min_capacity, device_total)]))
    return o if o.fits else None


def advise(trace: Trace, *, limit: int | None = None, device_total: int | None = None,
           jobs: int | None = None) -> AdviseResult:
    """Search settings that let ``trace`` fit under the limit (see the module docstring)."""
    kind = trace_kind(trace)
    cap = pick_limit(trace, limit, device_total)
    lb = lower_bound(trace)
    ooms = np.flatnonzero(trace.events.op == Op.OOM)
    from tracekit.sim import policies as registry

    names = registry.names() if kind == "raw" else []
    singles = single_candidates(kind, _site_of_failure(trace), names)
    # The singles, about as many combinations, and three bisections: the work that pays for workers.
    work = 2 * len(singles) + 3 * BISECT_REPLAYS
    runner = Runner(trace, default_jobs(jobs, tasks=len(singles), events=len(trace.events), replays=work),
                    counterfactual=kind != "raw")
    try:
        tried = outcomes(runner.map([Task(c, cap, device_total) for c in singles]))
        if kind == "raw":
            tried = [o for o in tried if o.heap]
        more = stage_two(kind, tried)
        tried += outcomes(runner.map([Task(c, cap, device_total) for c in more]))
        ranked = sorted(tried, key=lambda o: (not o.fits, rank_key(o) if o.fits else o.progress()))
        tasks = bisect_tasks(kind, ranked, lb, device_total)
        found = [(t.candidate, r) for t, r in zip(tasks, runner.map(tasks), strict=True)
                 if isinstance(r, PolicyFit) and r.min_capacity is not None]
        pool_fit = next((r for c, r in found if c.kind == Kind.CUPY_POOL), None)
        if pool_fit is not None and not any(o.fits and o.candidate.kind == Kind.CUPY_POOL for o in tried):
            raised = _raised_limit(pool_fit, runner, device_total)
            if raised is not None:
                tried.append(raised)
    finally:
        runner.close()
    fits = tuple(sorted((o for o in tried if o.fits and o.error is None), key=rank_key))
    mine = [cr for cr in found if fits and cr[0] == fits[0].candidate]
    setting, best = min(mine or found, key=lambda cr: cr[1].min_capacity or 0, default=(None, None))
    notes = _notes(trace, kind, tried)
    return AdviseResult(
        trace=str(trace.path) if trace.path else None, kind=kind, limit=cap,
        failing_seq=int(trace.events.seq[ooms[0]]) if len(ooms) else None, tried=tuple(tried), fits=fits,
        min_capacity=best.min_capacity if best else None, min_capacity_setting=setting, lower_bound=lb,
        top_sites=top_sites_at_peak(trace), command=trace.meta.command if kind == "torch" else None,
        notes=notes,
    )


def _notes(trace: Trace, kind: str, tried: list[Outcome]) -> tuple[str, ...]:
    out = []
    if kind == "cupy":
        out.append("MemoryAsyncPool and cudaMalloc are modelled as the device allocator, which showed no "
                   "external fragmentation on the H200: they fit when the live bytes at the device's "
                   "granularity fit; they are not replayed. The model is optimistic for MemoryAsyncPool: "
                   "on the H200 its own pool fragmented under a 256 MiB cap where cudaMalloc fit "
                   "(docs/fidelity.md); --verify-on-device checks both")
    if kind != "raw" and wrapped_start(trace):
        out.append("the trace starts from a rebuilt state (its history wrapped); every setting is replayed "
                   "from that state, which the recorded setting produced")
    errors = [o for o in tried if o.error]
    if errors:
        out.append(f"{len(errors)} setting(s) could not be replayed, e.g. {errors[0].candidate.label()}: "
                   f"{errors[0].error}")
    if kind == "raw":
        out.append("raw trace: each free-list policy is a simulated allocator over one heap of the limit's "
                   "size, not a setting of a library")
    return tuple(out)
