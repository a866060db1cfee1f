"""``advise(trace, ...)``: the whole search, from a read trace to an ``AdviseResult``.

Each device on its own (``tracekit.trace.devices``): its own pool, limit, room and
candidates; devices are never added together. A trace of several devices gives one result
per device (``AdviseResult.devices``) and the top-level answer is that of the device of the
fatal OOM (else the first that ran out, else the first device).

The limit is ``limit`` when given, else, when the device (not a pool limit) ran out at the
reported OOM and its free memory was measured there, the room the process had
(``tracekit.advise.overhead``: free + its pools' reserved bytes; overhead cures are then
offered), else the limit the run was held to at its failing request
(``trace.outcome.held_limit``: a limit the program set itself counts), else (raw traces) the
device total. Where no ``limit`` is given and a CuPy request failed in a pool the program made
itself, at the limit it set on that pool (``trace.outcome.failing_pool``; not where the device ran
out), no setting of the default pool answers it: that pool's rows are advised alone at that limit
(``trace.devices.select_pool``: CuPy's pools never share memory, and each has its own limit), and
the answer says so (``AdviseResult.pool``). Pool traces (PyTorch, CuPy) are replayed as counterfactual input
(``tracekit.advise.counterfactual``); raw traces as they are. The stages and the pruning are
those of ``tracekit.advise.search``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from tracekit.advise import overhead
from tracekit.advise.candidates import Candidate, Cure, Kind, PoolScope, cupy_pool
from tracekit.advise.capacity import PolicyFit, live_curve, lower_bound, needed_requests
from tracekit.advise.counterfactual import wrapped_start
from tracekit.advise.evaluate import Outcome
from tracekit.advise.rerun import program_words
from tracekit.advise.result import AdviseResult, OwnLimit, RoomAdvice, rank_key
from tracekit.advise.search import (
    Runner,
    Task,
    bisect_tasks,
    outcomes,
    single_candidates,
    stage_two,
)
from tracekit.advise.verdict import Margin, Verdict, margin_for
from tracekit.analysis.leaks import SiteBytes, by_label
from tracekit.analysis.summary import OOMReport
from tracekit.errors import UsageError
from tracekit.sim import policies
from tracekit.sim.base import Allocator
from tracekit.trace.callsite import CallSites, stack_ids, stack_table
from tracekit.trace.devices import pool_ids, select_device, select_pool, split_devices
from tracekit.trace.events import reserved_through
from tracekit.trace.outcome import (
    default_pool,
    failing_pool,
    failing_row,
    fatal_row,
    fatal_seq,
    held_limit,
    request_bytes,
)
from tracekit.trace.reader import Trace
from tracekit.trace.recorded import PoolKind
from tracekit.trace.schema import Op
from tracekit.trace.stacks import UserCode
from tracekit.units import format_size
from tracekit.workers import BISECT_REPLAYS, cap_workers, default_threads

TOP_SITES = 5


def trace_kind(trace: Trace) -> str:
    """The real allocator the trace was recorded through (an ``Allocator``: ``torch``, ``cupy``), as
    the registry's policy for its source says, or ``raw`` (synthetic traces and replays)."""
    name = policies.for_source(trace.meta.source)
    allocator = policies.allocator_of(name) if name is not None else None
    return allocator if allocator is not None else "raw"


def pick_limit(trace: Trace, limit: int | None, device_total: int | None, device: int | None = None) -> int:
    """The limit to advise at: ``limit`` where given, else the limit the run was held to on
    ``device`` (``held_limit``: at the failing request, else the default pool's as the program left
    it, so a limit the program set itself counts), else the device's size."""
    if limit is not None:
        return limit
    held = held_limit(trace.events, trace.meta, device)
    if held:
        return held
    dev = trace.meta.device
    total = device_total or (dev.total_bytes if dev else None)
    if total:
        return int(total)
    where = f"{trace.path}: " if trace.path else ""
    raise UsageError(f"{where}the trace records no limit and no device size; give --limit SIZE")


def own_limit(trace: Trace, device: int | None = None, pool: PoolScope | None = None) -> OwnLimit | None:
    """The limit the run was held to on ``device`` (``held_limit``) where ``record --limit`` did not
    set it (``OwnLimit``): not of the size ``record`` was given (``rerun``), or with no ``rerun`` to
    tell (not ``certain``). A CuPy program's own ``set_limit`` after recording began counts. ``pool``:
    the program's own pool the run failed in, whose limit is the program's, certainly (``record
    --limit`` sets the default pool's alone)."""
    if pool is not None:
        return OwnLimit(pool.limit, certain=True, pool=pool)
    limit, rerun = held_limit(trace.events, trace.meta, device), trace.meta.recorded.rerun
    # record --torch --limit L sets the fraction L / total, which PyTorch turns back into whole bytes:
    # L or L - 1 (4 GiB on an H100's 85,017,493,504 bytes comes back as 4,294,967,295)
    said = rerun.limit_bytes if rerun is not None else None
    if not limit or (said is not None and abs(said - limit) <= 1):
        return None
    return OwnLimit(int(limit), certain=rerun is not None)


def top_sites_at_peak(trace: Trace, user_code: UserCode = UserCode(),
                      live: np.ndarray | None = None) -> tuple[SiteBytes, ...]:
    """Call-sites (labels: the user's line and the request's, ``tracekit.trace.callsite``) holding
    the most live bytes at the peak of live bytes (the fatal request counts); ``live``: the
    trace's ``live_curve`` where the caller has it (one pass over the events fewer)."""
    live = live_curve(trace) if live is None else live
    if len(live) == 0:
        return ()
    ev, k = trace.events, int(np.argmax(live))
    idx = np.arange(len(ev))
    held = needed_requests(trace) & (idx <= k) & ((trace.mate < 0) | (trace.mate > k))
    b = np.flatnonzero(held)
    return by_label(stack_ids(ev)[b], ev.size[b], CallSites.of(stack_table(ev), user_code), TOP_SITES)


def own_pool(trace: Trace, device: int, kind: str) -> tuple[Trace, PoolScope] | None:
    """Where a CuPy request failed in a ``MemoryPool`` the program made itself because the request
    would have taken it over the limit the program set on it (``failing_pool``): what advise searches
    instead of the device, that pool's rows alone (``select_pool``), and the pool (``PoolScope``);
    None otherwise (the device ran out under that limit: the device's question). Whether the limit
    was what failed: the pool measured at the OOM (``FailingPool.over_limit``), else its own
    reserved bytes before the request, from its rows. Where the trace's pool column does not put
    the failing request in that pool, its rows cannot be told apart: every row of the device stands
    in for them (``PoolScope.alone`` False), an upper estimate of that pool, and only a measured
    total tells that the limit failed."""
    if kind != Allocator.CUPY:
        return None
    failed = failing_pool(trace.events, trace.meta, device)
    if failed is None or failed.pool.kind not in (None, PoolKind.POOL):  # an async pool is no MemoryPool
        return None
    p = failed.pool
    row = failing_row(trace.events, trace.meta.recorded, device)
    alone = row is not None and int(pool_ids(trace)[row]) == p.id
    sub = select_pool(trace, p.id) if alone else trace
    if alone and fatal_seq(sub.events, sub.meta.recorded) != fatal_seq(trace.events, trace.meta.recorded):
        return None  # its rows alone would end the run otherwise (it survived there and went on elsewhere)
    over = failed.over_limit
    if over is None and alone:
        at = failing_row(sub.events, sub.meta.recorded, device)
        reserved = reserved_through(sub.events, at) if at is not None else 0
        over = reserved + failed.request > failed.limit
    if not over:
        return None
    return sub, PoolScope(p.id, p.device, p.label, failed.limit, alone)


def replayed_rows(trace: Trace, result: AdviseResult) -> Trace:
    """The rows of ``trace`` that advise replayed for ``result``: its device's, and of those the
    program's own pool's where it answered for that pool alone (``own_pool``), or the default pool's
    where it replayed those alone (``AdviseResult.default_alone``: ``default_rows``)."""
    own = select_device(trace, result.device) if result.device is not None else trace
    if result.pool is not None:
        return select_pool(own, result.pool.id) if result.pool.alone else own
    return default_rows(own, result.device or 0, result.kind) if result.default_alone else own


def default_rows(trace: Trace, device: int, kind: str) -> Trace:
    """A CuPy trace's rows of ``device``'s default pool alone, where the run died of that pool's request
    at the limit it was held to and the trace's ``pool`` column marks rows of other pools too (the
    program's own pools): CuPy's ``set_limit`` holds the default pool's own bytes, never another
    pool's. Only where those rows account for the pool: their reserved bytes at the failing request
    are the pool's measured there (``oom_states``), or, not measured, they and the request go over
    the limit (a program that wraps the default pool's ``malloc`` in a function of its own has its
    segments recorded as no pool's); and where the run still dies of that request on those rows alone
    (a program that survived it and went on in another pool). ``trace`` itself otherwise: a run that
    did not die, another pool's request, no limit (the device's question, which every pool's bytes
    count against)."""
    if kind != Allocator.CUPY:
        return trace
    recorded = trace.meta.recorded
    default, row = default_pool(recorded, device), fatal_row(trace.events, recorded)
    if default is None or row is None or int(trace.events.device[row]) != device:
        return trace
    ids = pool_ids(trace)
    if int(ids[row]) != default.id or bool((ids == default.id).all()):
        return trace
    limit = held_limit(trace.events, trace.meta, device)
    if not limit:
        return trace
    seq = int(trace.events.seq[row])
    sub = select_pool(trace, default.id)
    at = fatal_row(sub.events, sub.meta.recorded)
    if at is None or int(sub.events.seq[at]) != seq:
        return trace
    reserved = reserved_through(sub.events, at)
    state = recorded.oom_states.get(seq)
    if state is not None and state.pool_total is not None:
        return sub if reserved == state.pool_total else trace
    return sub if reserved + request_bytes(trace.events, row) > limit else trace


def own_async_pool(trace: Trace, device: int, kind: str) -> str | None:
    """Where a CuPy request failed in a ``MemoryAsyncPool`` the program made itself, measured over the
    limit it set on it: the sentence that says so (advise models such a pool as the device allocator,
    with no limit of its own to search); None otherwise."""
    if kind != Allocator.CUPY:
        return None
    failed = failing_pool(trace.events, trace.meta, device)
    if failed is None or failed.pool.kind != PoolKind.ASYNC or not failed.over_limit:
        return None
    if failed.used is None or failed.total is None or failed.total - failed.used >= failed.request:
        return None  # room inside the pool: CuPy raises at the limit only where the pool has none free
    scope = PoolScope(failed.pool.id, failed.pool.device, failed.pool.label, failed.limit, False)
    return (f"the request failed in the program's own MemoryAsyncPool {scope.name()}, which would have "
            f"gone over the limit the program set on it ({format_size(failed.limit)}; "
            f"{format_size(failed.total or 0)} held, {format_size(failed.request)} asked): raise that "
            "pool's limit in the program; advise models a MemoryAsyncPool as the device allocator, with no "
            "limit of its own to search")


def _site_of_failure(trace: Trace) -> str | None:
    """The failing request's recorded one-frame ``site`` (where ``free_all_blocks()`` would go:
    the candidate's evaluation finds the rows by that name)."""
    ev = trace.events
    row = failing_row(ev, trace.meta.recorded)
    if row is None or ev.site[row] < 0:
        return None
    return ev.sites[ev.site[row]]


BISECT_WIDTH = 15  # threads a bisection's round uses at most: four halvings (1 + 2 + 4 + 8 replays)
# A thread's memory per event: a replay's arrays and its setting's copies of the input (the
# events and the prepared input are shared by every thread); bytes, an upper estimate.
THREAD_EVENT_BYTES = 96

RAISES = 4  # replays at most, raising a capacity that gets through until it fits with the margin
STEP = 2 << 20  # bytes: capacities are raised in whole device pages


def clearing(peak: int, margin: Margin) -> int:
    """The smallest capacity (whole ``STEP``s) whose headroom over ``peak`` exceeds the margin there:
    ``cap - peak > margin.bytes_at(cap)``, the margin being a fraction of the capacity itself."""
    cap = -(-(peak + margin.bytes_at(peak) + 1) // STEP) * STEP
    while cap - peak <= margin.bytes_at(cap):  # the margin grew with the capacity: a step or two more
        cap += STEP
    return cap


def _with_margin(cand: Candidate, fit: PolicyFit | None, runner: Runner, device_total: int | None,
                 margin: Margin) -> Outcome | None:
    """``cand`` evaluated at the smallest capacity where it fits with the margin (``FITS``), or None.

    The search starts at the smallest capacity its replay gets through (``fit``, bisected), where
    the headroom is near 0 and the verdict at best ``BORDERLINE``: a real run of a reactive workload
    there fails (``docs/fidelity.md``). Until the verdict is ``FITS`` the capacity is raised to the
    one that clears the margin over the peak just replayed (``clearing``), or, where the replay
    failed there (fitting need not be monotone: handled OOMs are served as the capacity grows), by
    the margin, and replayed again (the peak can move with the capacity), for at most ``RAISES``
    replays. None: no capacity tried fits with the margin; nothing else is offered as a fit.
    """
    if fit is None or fit.min_capacity is None or not margin.explains:
        return None
    cap = fit.min_capacity
    for _ in range(RAISES):
        (o,) = outcomes(runner.map([Task(cand, cap, device_total)]))
        o = o.judged(margin)
        if o.verdict == Verdict.FITS:
            return o
        if o.verdict == Verdict.ERROR:
            return None
        raised = clearing(o.peak_reserved, margin) if o.fits else cap + margin.bytes_at(cap)
        cap = max(-(-raised // STEP) * STEP, cap + STEP)
    return None


def advise(trace: Trace, *, limit: int | None = None, device_total: int | None = None,
           jobs: int | None = None, user_code: UserCode = UserCode()) -> AdviseResult:
    """Search settings that let ``trace`` fit, device by device (see the module docstring);
    ``user_code``: what counts as the user's code where a call-site is named."""
    if limit is not None and limit <= 0:
        raise UsageError(f"--limit {limit}: give a positive size (CuPy reads a limit of 0 as no limit)")
    parts = split_devices(trace) or [(0, trace)]
    reports = _reported_ooms(trace, user_code)
    if len(parts) == 1:
        d, sub = parts[0]
        return _advise_device(sub, d, reports.get(d), limit, device_total, jobs, user_code)
    results = [_advise_device(sub, d, reports.get(d), limit, device_total, jobs, user_code)
               for d, sub in parts]
    fatal = fatal_seq(trace.events, trace.meta.recorded)
    ran_out = [r for (_, sub), r in zip(parts, results, strict=True) if np.any(sub.events.op == Op.OOM)]
    main = next((r for r in results if fatal is not None and r.failing_seq == fatal),
                ran_out[0] if ran_out else results[0])
    return dataclasses.replace(main, devices=tuple(results))


def _reported_ooms(trace: Trace, user_code: UserCode) -> dict[int, OOMReport]:
    """Per device, the OOM analyze reports (the fatal one, else the first), where the recorder
    measured the device at an OOM (format v2); else nothing, and no analysis is run."""
    from tracekit.analysis.recording import oom_states

    if not oom_states(trace.meta.recorded):
        return {}
    from tracekit.analysis.analyze import analyze_trace

    summary = analyze_trace(trace, timeline=False, user_code=user_code).summary
    return {s.device or 0: s.oom for s in (summary.devices or (summary,)) if s.oom is not None}


def _advise_device(trace: Trace, device: int, report: OOMReport | None, limit: int | None,
                   device_total: int | None, jobs: int | None, user_code: UserCode) -> AdviseResult:
    """One device's search."""
    kind = trace_kind(trace)
    room = None
    if report is not None and kind != "raw":
        room = overhead.room_at(report, overhead.failing_pool_limit(trace, report))
    asked = []
    if room is not None and limit is not None:  # the user's question, with the room said beside it
        asked.append(f"--limit {limit} asked instead of the room the device left: {room.sentence()}")
        room = None
    # The program's own pool ran out at its own limit (the device did not: no room): that pool's question.
    scoped = own_pool(trace, device, kind) if room is None and limit is None else None
    pool, alone = None, False
    if scoped is not None:
        trace, pool = scoped
        report = None  # the analysis was of the whole device; the room and its cures are the device's
    elif room is None and limit is None:  # the recorded limit's question: the default pool's own rows
        whole = len(trace.events)
        trace = default_rows(trace, device, kind)
        alone = len(trace.events) < whole
        if alone:
            asked.append(f"the default pool's rows alone were replayed ({len(trace.events)} of {whole} "
                         "events): CuPy's set_limit holds that pool's own bytes, never another pool's")
    cap = (pool.limit if pool is not None else room.bytes if room is not None
           else pick_limit(trace, limit, device_total, device))
    ooms = np.flatnonzero(trace.events.op == Op.OOM)
    from tracekit.sim import policies as registry

    # A raw trace is advised among the heaps alone (only those answer "this device, this heap"):
    # the other policies are not replayed, where their answers were thrown away after the replay.
    heaps = [name for name in registry.names() if registry.is_heap(name)] if kind == "raw" else []
    singles = single_candidates(kind, _site_of_failure(trace), heaps)
    # The singles, about as many combinations, and three bisections, every replay whole: the most
    # work there can be.
    work = 2 * len(singles) + 3 * BISECT_REPLAYS
    # Threads for the singles, or for a bisection's rounds (``Runner.bisect``: up to four halvings
    # a round on 15), whichever is more; as many as the memory holds.
    n = len(trace.events)
    want = default_threads(jobs, tasks=max(len(singles), BISECT_WIDTH), events=n, replays=work)
    runner = Runner(trace, cap_workers(want, tasks=want, worker_bytes=THREAD_EVENT_BYTES * n),
                    counterfactual=kind != "raw")
    room_advice = None
    try:
        # Threads the singles leave idle make, ahead, the unbounded replays their bisections start
        # from; kept by the runner, not redone.
        searchable = [c for c in singles if c.policy is not None]
        singles_at_cap = [Task(c, cap, device_total) for c in singles]
        runner.begin(singles_at_cap)
        # Begun, not waited for: where a setting fits, its bisection needs no unbounded replay (the
        # replay at the limit already tells), and the search goes on without waiting for them. As
        # many as the threads the singles leave idle, counted after the settings that replay alike
        # are folded into one (five PyTorch settings can be one replay).
        runner.begin([Task(c, None, None, probe=True) for c in searchable], at_most=runner.idle())
        # While those replay (where they run on threads): what only the answer needs, computed in
        # this thread, which would otherwise wait. The live curve once (the lower bound and the
        # sites at the peak both read it; NumPy, which lets the GIL go); computed before the first
        # replay began, it held back every replay (4M events on the 2-core machine: 0.11 s).
        margin = margin_for(kind, trace)
        live = live_curve(trace)
        lb = lower_bound(trace, live)
        top_sites = top_sites_at_peak(trace, user_code, live)
        first = outcomes(runner.map(singles_at_cap))
        tried = [o.judged(margin) for o in first]  # a raw trace's: the heaps', a failed one's error shown
        more = stage_two(kind, tried)
        tried += [o.judged(margin) for o in outcomes(runner.map([Task(c, cap, device_total) for c in more]))]
        ranked = sorted(tried, key=lambda o: (not o.fits, rank_key(o) if o.fits else o.progress()))
        tasks = bisect_tasks(kind, ranked, lb, device_total)
        found = [(t.candidate, r) for t, r in zip(tasks, runner.bisect(tasks), strict=True)
                 if r.min_capacity is not None]
        pool_fit = next((r for c, r in found if c.kind == Kind.CUPY_POOL), None)
        if room is not None and report is not None:  # the device ran out: its room cannot be raised
            room_advice = _room_advice(runner, trace, kind, report, room, found, lb, device_total, margin)
            tried += room_advice.tried
        elif pool_fit is not None and not any(o.ok and o.candidate.kind == Kind.CUPY_POOL for o in tried):
            raised = _with_margin(cupy_pool(Kind.CUPY_LIMIT), pool_fit, runner, device_total, margin)
            if raised is not None:
                tried.append(raised)
        if room is None and limit is None and len(ooms):
            unexplained = _unexplained(trace, kind, tried, cap, runner, device_total, margin, pool)
            if unexplained is not None:  # a MemoryAsyncPool of the program's at its own limit says so
                unexplained = own_async_pool(trace, device, kind) or unexplained
                margin = dataclasses.replace(margin, explains=False, why=unexplained)
                tried = [o.judged(margin) for o in tried]
        fits = _ranked_fits(tried, room_advice)
        mine = [cr for cr in found if fits and cr[0] == fits[0].candidate]
        setting, best = min(mine or found, key=lambda cr: cr[1].min_capacity or 0, default=(None, None))
        # Said only when nothing fits at the limit: the capacity to ask for, with the margin.
        at_margin = (_with_margin(setting, best, runner, device_total, margin)
                     if setting is not None and not fits and room_advice is None else None)
    finally:
        runner.close()
    borderline = tuple(sorted((o for o in tried if o.verdict == Verdict.BORDERLINE and not o.candidate.cures),
                              key=lambda o: (-(o.headroom or 0), rank_key(o))))
    notes = _notes(trace, kind, tried) + (room_advice.notes if room_advice is not None else ()) + tuple(asked)
    return AdviseResult(
        trace=str(trace.path) if trace.path else None, kind=kind, limit=cap,
        failing_seq=fatal_seq(trace.events, trace.meta.recorded), tried=tuple(tried), fits=fits,
        min_capacity=best.min_capacity if best else None, min_capacity_setting=setting, lower_bound=lb,
        fit_capacity=at_margin.capacity if at_margin is not None else None,
        top_sites=top_sites,
        command=trace.meta.command if kind == Allocator.TORCH else None,
        own_limit=own_limit(trace, device, pool), program=program_words(trace),
        notes=notes, device=device, room=room_advice, margin=margin, borderline=borderline, pool=pool,
        default_alone=alone,
    )


def recorded_setting(trace: Trace, kind: str) -> Candidate | None:
    """The candidate the run was recorded under: PyTorch's recorded ``PYTORCH_CUDA_ALLOC_CONF`` (its
    defaults when none), CuPy's pool, RMM's pool; None for raw traces."""
    from tracekit.advise.candidates import torch as torch_setting
    from tracekit.sim.options import parse_alloc_conf

    if kind == Allocator.TORCH:
        text = trace.meta.recorded.torch_settings.alloc_conf
        try:
            opts = parse_alloc_conf(text) if text is not None else {}
        except UsageError:
            return None
        return torch_setting(opts)
    if kind == Allocator.RMM_POOL:
        from tracekit.advise.candidates import rmm_pool

        return rmm_pool()
    return cupy_pool() if kind == Allocator.CUPY else None


def _unexplained(trace: Trace, kind: str, tried: Sequence[Outcome], cap: int, runner: Runner,
                 device_total: int | None, margin: Margin, pool: PoolScope | None = None) -> str | None:
    """Why no headroom of this trace is evidence, or None. The recorded setting's prediction at the
    recorded limit gets through the failing request or serves OOMs the program met: when the
    recording replayed exactly as recorded does so too, the trace does not explain the failure;
    else the prediction departs from the recording for its own setting. The recorded setting is
    replayed here where the search did not try it (a setting off the candidates' grid). ``pool``:
    the program's own pool ``trace`` is the rows of, which ran out at its own limit: nothing outside
    it (another process, the context) counts against that limit, so none is named."""
    from tracekit.sim.base import SimConfig
    from tracekit.sim.engine import replay
    from tracekit.trace.outcome import handled_rows

    base = recorded_setting(trace, kind)
    if base is None:
        return None
    rec = next((o for o in tried if o.candidate == base and not o.candidate.cures), None)
    if rec is None:
        (got,) = outcomes(runner.map([Task(base, cap, device_total)]))
        rec = got.judged(margin)
    died = fatal_seq(trace.events, trace.meta.recorded) is not None
    if rec.error is not None or not ((died and rec.fits) or rec.handled_served):
        return None
    assert rec.candidate.policy is not None
    what = ("gets through the request that failed" if died and rec.fits
            else f"serves {rec.handled_served} of the OOMs the program met")
    exact = replay(trace, rec.candidate.policy, SimConfig(capacity=cap)).summary
    handled = int(handled_rows(trace.events, trace.meta.recorded).sum())
    if (died and exact.oom is None) or exact.handled_ooms < handled:
        if pool is not None:  # nothing outside the pool counts against its own limit: none is named
            return (f"the setting the run was recorded under ({rec.label()}), replayed exactly as recorded "
                    f"on that pool's rows at the limit the program set on it, {what}: its rows in the trace "
                    "do not explain its failure, so no setting is called a fit (tracekit analyze shows the "
                    "pool measured at the OOM)")
        return (f"the setting the run was recorded under ({rec.label()}), replayed exactly as recorded at "
                f"the recorded limit, {what}: the trace does not explain the failure, so no setting is "
                "called a fit. The memory went to something the trace does not hold (another process, "
                "the CUDA context, another allocator): run tracekit budget on that GPU, see the device "
                "measured at the OOM (tracekit analyze), or record the other allocator")
    return (f"the prediction for the setting the run was recorded under ({rec.label()}) {what}, where the "
            "recording replayed exactly as recorded fails as the run did: the model departs from this run "
            "under its own setting, so no setting is called a fit (advise --rerun tries them for real)")


def _ranked_fits(tried: Sequence[Outcome], room: RoomAdvice | None) -> tuple[Outcome, ...]:
    """Settings that fit (ranked by ``rank_key``), then the cures that fit: the pick first, then by
    ``overhead.preference``. A setting that fits within the room needs no cure."""
    ok = [o for o in tried if o.ok]
    settings = sorted((o for o in ok if not o.candidate.cures), key=rank_key)
    cures = sorted((o for o in ok if o.candidate.cures),
                   key=lambda o: (room is None or o is not room.pick, overhead.preference(o.candidate.cures)))
    return tuple(settings + cures)


def _room_advice(runner: Runner, trace: Trace, kind: str, report: OOMReport, room: overhead.Room,
                 found: Sequence[tuple[Candidate, PolicyFit]], lb: int, device_total: int | None,
                 margin: Margin) -> RoomAdvice:
    """The cures the budget at the OOM shows, each replayed alone with the room it gives back, and
    the smallest set with which the run fits (replayed too when it holds several)."""
    base = overhead.recorded(kind)
    need = next((r.min_capacity for c, r in found if c == base), None)
    if need is None:
        (fit,) = runner.bisect([Task(base, None, device_total, True, lb)])
        need = fit.min_capacity
    room = dataclasses.replace(room, need=need)
    cures = overhead.cures(trace, kind, report)
    chosen = overhead.smallest_set(cures, need - room.bytes) if need is not None else None
    sets: list[tuple[Cure, ...]] = [(c,) for c in cures]
    if chosen and len(chosen) > 1:
        sets.append(chosen)
    tasks = [Task(overhead.as_candidate(base, s), room.capacity(sum(c.returns for c in s)), device_total)
             for s in sets]
    tried = [o.judged(margin) for o in outcomes(runner.map(tasks))]
    pick = next((o for o in tried if chosen and o.candidate.cures == chosen), None)
    notes: tuple[str, ...] = ()
    if need is not None and need <= room.bytes:
        notes = (f"the recorded setting replays within the room ({room.sentence()}) although the device "
                 "refused the request: the device needed more than the pool's counters show (its 2 MiB "
                 "pages), or the failing request was handled",)
    notes += overhead.unsized(report)
    return RoomAdvice(room, cures, tuple(tried), pick, chosen is None and need is not None, notes)


def _notes(trace: Trace, kind: str, tried: list[Outcome]) -> tuple[str, ...]:
    out = []
    if kind == Allocator.CUPY:
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
