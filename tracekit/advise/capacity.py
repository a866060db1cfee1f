"""What-if: the smallest capacity at which each simulated allocator replays a trace without OOM.

For each policy the search replays the trace (``tracekit.sim.engine.fits``)
at capacities that are multiples of ``step`` (2 MiB, the device's own
allocation granularity) and bisects between a capacity known to fail and
one known to fit:

- lower bound LB = max over time of Σ ⌈requested / 512⌉ · 512 over live
  requests, counting the fatal ``oom`` row as a request that stays live (the
  replay retries it) and none that the program survived (a handled ``oom``
  row: the retry or fallback that replaced it is in the trace). Every policy
  rounds to at least 512 bytes, so no allocator can succeed below LB; the
  largest multiple of ``step`` below LB is the first known failure.
- upper end: the peak reserved bytes of an unbounded replay, rounded up to
  ``step`` (doubled until the replay fits, up to ``max_capacity``).

The answer C is verified: the trace fits at C and fails at C − step (more
capacity is assumed never to hurt; the two replays next to the answer check
it locally). LB is a floor for every allocator, so the search never goes
below it, also for a trace that starts from an imported pool state (PyTorch
snapshots: the ``initial`` extra column), whose starting blocks a replay does
not re-check against the capacity. ``overhead`` = C − LB, ``overhead_ratio`` = C / LB − 1. The
searches run side by side in threads of this process, on the trace it read (``_run``).

A trace of several devices is searched per device (each device's events alone, its own
bound and capacities): devices never share one simulated address space.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import numpy as np

from tracekit.advise.bisection import Bisection, Found, Probe, Same, Unbounded, alike
from tracekit.trace.devices import device_ids, select_device
from tracekit.trace.live import live_bytes, paired_frees, round_up
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size
from tracekit.workers import BISECT_REPLAYS, Pool, default_threads

STEP = 2 << 20
LOWER_BOUND_DESCRIPTION = (
    "peak live bytes (512 B rounded): max over time of the sum of requests rounded up to 512 B, "
    "the fatal oom row counted as live, handled ones not"
)
_LIMIT = 1 << 50  # 1 PiB: where the doubling search gives up


class PolicyFitDict(TypedDict):
    """One policy in ``whatif --json``; ``*_bytes`` are the fields ``min_capacity``,
    ``unbounded_peak_reserved``, ``searched_up_to`` and the derived ``overhead``."""

    policy: str
    min_capacity_bytes: int | None
    overhead_bytes: int | None
    overhead_ratio: float | None
    unbounded_peak_reserved_bytes: int | None
    replays: int
    searched_up_to_bytes: int
    error: str | None


class WhatIfDict(TypedDict):
    """``whatif --json``; ``devices`` only for a trace of several devices."""

    trace: str | None
    device: int | None
    lower_bound_bytes: int | None
    lower_bound_description: str
    step_bytes: int
    max_capacity_bytes: int | None
    policies: list[PolicyFitDict]
    devices: NotRequired[list[WhatIfDict]]


@dataclass(frozen=True)
class PolicyFit:
    """One policy's answer: ``min_capacity`` None when no capacity up to the limit fits."""

    policy: str
    min_capacity: int | None
    lower_bound: int
    unbounded_peak_reserved: int | None
    replays: int
    searched_up_to: int
    error: str | None = None

    @property
    def overhead(self) -> int | None:
        """min_capacity − lower bound (bytes)."""
        return None if self.min_capacity is None else self.min_capacity - self.lower_bound

    @property
    def overhead_ratio(self) -> float | None:
        """min_capacity / lower bound − 1."""
        if self.min_capacity is None or self.lower_bound <= 0:
            return None
        return self.min_capacity / self.lower_bound - 1

    def to_dict(self) -> PolicyFitDict:
        return PolicyFitDict(
            policy=self.policy, min_capacity_bytes=self.min_capacity, overhead_bytes=self.overhead,
            overhead_ratio=self.overhead_ratio, unbounded_peak_reserved_bytes=self.unbounded_peak_reserved,
            replays=self.replays, searched_up_to_bytes=self.searched_up_to, error=self.error,
        )


@dataclass(frozen=True)
class WhatIfResult:
    """Per-policy smallest capacities next to the lower bound (peak live bytes, 512 B rounded).

    ``device``: the device searched; a trace of several devices has one result per device in
    ``devices`` and no figures of its own (``lower_bound`` None, ``fits`` empty).
    """

    trace: str | None
    lower_bound: int | None
    step: int
    max_capacity: int | None
    fits: tuple[PolicyFit, ...] = field(default_factory=tuple)
    device: int | None = None
    devices: tuple[WhatIfResult, ...] = ()

    def to_dict(self) -> WhatIfDict:
        d = WhatIfDict(
            trace=self.trace, device=self.device, lower_bound_bytes=self.lower_bound,
            lower_bound_description=LOWER_BOUND_DESCRIPTION, step_bytes=self.step,
            max_capacity_bytes=self.max_capacity, policies=[f.to_dict() for f in self.fits],
        )
        if self.devices:
            d["devices"] = [p.to_dict() for p in self.devices]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WhatIfResult:
        """The result of ``whatif --json`` output ``d`` (checked first by ``report.sections.load_whatif``);
        a policy's capacity may also be named ``capacity_bytes``, as older outputs named it."""

        def num(x: object) -> int | None:
            return None if x is None or isinstance(x, bool) or not isinstance(x, int | float) else int(x)

        def fit(r: Mapping[str, Any], bound: int | None) -> PolicyFit:
            cap = r.get("min_capacity_bytes", r.get("capacity_bytes"))
            return PolicyFit(policy=str(r.get("policy")), min_capacity=num(cap), lower_bound=bound or 0,
                             unbounded_peak_reserved=num(r.get("unbounded_peak_reserved_bytes")),
                             replays=num(r.get("replays")) or 0,
                             searched_up_to=num(r.get("searched_up_to_bytes")) or 0,
                             error=str(r["error"]) if r.get("error") else None)

        bound = num(d.get("lower_bound_bytes"))
        parts = d.get("devices")
        each = parts if isinstance(parts, list) else []
        devices = tuple(cls.from_dict(p) for p in each if isinstance(p, Mapping))
        trace = d.get("trace")
        return cls(trace=trace if isinstance(trace, str) else None, lower_bound=bound,
                   step=num(d.get("step_bytes")) or STEP, max_capacity=num(d.get("max_capacity_bytes")),
                   fits=tuple(fit(r, bound) for r in d.get("policies") or () if isinstance(r, Mapping)),
                   device=num(d.get("device")), devices=devices)

    def to_text(self) -> str:
        if self.devices:
            return "\n\n".join(f"device {p.device}:\n{p.to_text()}" for p in self.devices)
        rows = [("policy", "smallest capacity", "over the bound", "replays")]
        for f in self.fits:
            if f.error:
                rows.append((f.policy, "error", f.error, str(f.replays)))
            elif f.min_capacity is None:
                rows.append((f.policy, f"> {format_size(f.searched_up_to)}", "n/a", str(f.replays)))
            else:
                assert f.overhead is not None
                sign = "+" if f.overhead >= 0 else "-"
                # no ratio over a bound of 0 (a trace that holds nothing live)
                ratio = f" ({f.overhead_ratio:+.1%})" if f.overhead_ratio is not None else ""
                over = f"{sign}{format_size(abs(f.overhead))}{ratio}"
                rows.append((f.policy, format_size(f.min_capacity), over, str(f.replays)))
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"lower bound (peak live bytes, 512 B rounded): {format_size(self.lower_bound)}"]
        lines += [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}" for r in rows]
        from tracekit.sim import policies as registry

        pools = [f.policy for f in self.fits if registry.is_pool(f.policy)]
        note = f"; for {' and '.join(pools)} the capacity is the pool limit" if pools else ""
        lines.append(f"(capacities in steps of {format_size(self.step)}{note}; each fits, and one step "
                     "below it does not, but fitting need not be monotone: a smaller capacity may get "
                     "through, as a real CuPy pool did at 50-54 MiB where it failed at 56-60 MiB, "
                     "docs/fidelity.md)")
        return "\n".join(lines)


def lower_bound(trace: Trace, live: np.ndarray | None = None) -> int:
    """Peak of Σ ⌈requested/512⌉·512 over live requests (``live_curve``; ``live``: it, where had)."""
    live = live_curve(trace) if live is None else live
    return int(max(0, live.max())) if len(live) else 0


def needed_requests(trace: Trace) -> np.ndarray:
    """Bool per event: a request the program needed served: a ``malloc``, or the fatal ``oom`` row
    (which stays live: the program needed it to go on). An ``oom`` row the program survived
    (``trace.outcome.handled_rows``) is not one: what it did instead is in the trace."""
    from tracekit.trace.outcome import handled_rows

    ev = trace.events
    return (ev.op == Op.MALLOC) | ((ev.op == Op.OOM) & ~handled_rows(ev, trace.meta.recorded))


def live_curve(trace: Trace) -> np.ndarray:
    """Σ ⌈requested/512⌉·512 over live ``needed_requests`` after every event (int64, bytes)."""
    ev = trace.events
    req = round_up(ev.size.astype(np.int64))
    return live_bytes(req, needed_requests(trace), paired_frees(ev.op, trace.mate), trace.mate)


def same_of(stats: np.ndarray, ran_out: bool, peak: int) -> tuple[Same, ...]:
    """The capacities at which a replay (its ``stats``, its peak reserved ``peak``) replays alike, with
    the answer there (``bisection.alike``); empty: not known."""
    from tracekit.sim.codes import Stat

    return alike(int(stats[Stat.SAME_FROM]), int(stats[Stat.SAME_BELOW]), ran_out, peak)


def probe(trace: Trace, policy: str, capacity: int | None, options: Mapping[str, str] | None = None,
          counterfactual: bool = False, alike: bool = True) -> Probe:
    """One replay of the search (``tracekit.advise.bisection``) at ``capacity`` (None: unbounded),
    under the policy's settings ``options``; ``counterfactual`` as ``search`` takes it; ``alike``:
    where the replay is alike, said at any cost (``SimConfig.alike``; a search without reuse
    does not read it)."""
    from tracekit.sim.base import SimConfig
    from tracekit.sim.codes import Stat

    config = SimConfig(capacity=capacity, options=dict(options or {}), alike=alike, per_event=False)
    res = _replayer(trace, policy, counterfactual)(config)
    stats = res.run.stats
    return Probe(capacity, res.ran_out, res.summary.peak_reserved_bytes, int(stats[Stat.ASKED]),
                 same_of(stats, res.ran_out, res.summary.peak_reserved_bytes))


def search(trace: Trace, policy: str, *, step: int = STEP, max_capacity: int | None = None,
           lb: int | None = None, options: Mapping[str, str] | None = None,
           counterfactual: bool = False, reuse: bool = False, known: Unbounded | None = None,
           seen: Sequence[Same] = ()) -> PolicyFit:
    """Bisection for one policy (see the module docstring), one replay at a time
    (``tracekit.advise.bisection``); ``options`` are the policy's settings.

    ``counterfactual``: ``trace`` is a prepared recording (``advise.counterfactual.prepare``)
    and every replay goes through ``counterfactual_replay``, the prediction ``replay``,
    ``advise`` and ``whatif`` share for a recording under a pool policy.

    ``reuse`` (advise): a capacity at or above the unbounded replay's ``Stat.ASKED`` replays the
    same steps as unbounded, so its answer is the unbounded one's, not replayed; ``known``: the
    unbounded replay's figures, had from a replay the same steps make (also not replayed). So
    is a capacity at which a replay made before replays alike (``Stat.SAME_FROM`` up to below
    ``Stat.SAME_BELOW``): one of the search's own, or one of ``seen`` (``same_of``: replays
    of the same input and setting, at a capacity and no device total, made elsewhere).
    ``replays`` counts the replays made.
    """
    lb = lower_bound(trace) if lb is None else lb
    limit = max_capacity if max_capacity is not None else _LIMIT
    b = Bisection(lb, step, limit, known, seen, reuse)
    while wanted := b.wanted():
        b.learn(probe(trace, policy, wanted[0], options, counterfactual, alike=reuse))
    return fit_of(b, policy)


def bisection_for(lb: int, max_capacity: int | None, known: Unbounded | None = None,
                  seen: Sequence[Same] = ()) -> Bisection:
    """Advise's search of one setting's smallest capacity (2 MiB steps, answers from what replays
    know: ``search`` with ``reuse``), its replays made by the caller (``advise.search.Runner``)."""
    limit = max_capacity if max_capacity is not None else _LIMIT
    return Bisection(lb, STEP, limit, known, seen, reuse=True)


def fit_of(b: Bisection, policy: str) -> PolicyFit:
    """The ``PolicyFit`` of a search whose walk has ended (``b.wanted()`` empty)."""
    end = b.walk()
    assert isinstance(end, Found), "fit_of: the walk has not ended in an answer"
    return PolicyFit(policy, end.min_capacity, b.lb, end.unbounded_peak_reserved, end.replays, b.limit)


def _replayer(trace: Trace, policy: str, counterfactual: bool) -> Callable[[Any], Any]:
    """config -> ReplayResult: the plain replay, or the counterfactual one of a prepared recording."""
    if counterfactual:
        from tracekit.advise.counterfactual import counterfactual_replay

        return lambda cfg: counterfactual_replay(trace, policy, cfg)[1]
    from tracekit.sim.engine import replay

    return lambda cfg: replay(trace, policy, cfg)


@dataclass(frozen=True)
class _Task:
    """One policy's search on one device (``device`` None: the trace has one device)."""

    device: int | None
    policy: str
    step: int
    max_capacity: int | None
    lb: int


@dataclass(frozen=True)
class _Input:
    """What one search replays: the trace (a device's part, prepared where ``counterfactual``) and
    the policy's options (the recorded setting)."""

    trace: Trace
    counterfactual: bool
    options: Mapping[str, str]


class _Inputs:
    """What each search replays, made once in this thread before any search's thread asks: per
    device, its part of the trace, and its prepared form where a policy replays a recording through
    the counterfactual prediction (with the policy's recorded setting)."""

    def __init__(self, trace: Trace, tasks: Sequence[_Task]) -> None:
        from tracekit.advise.counterfactual import prepare, setting, uses_counterfactual

        self._made: dict[tuple[int | None, str], _Input] = {}
        parts: dict[int | None, Trace] = {}
        prepared: dict[int | None, Trace] = {}
        for t in tasks:
            if t.device not in parts:
                parts[t.device] = select_device(trace, t.device) if t.device is not None else trace
            part = parts[t.device]
            if not uses_counterfactual(part, t.policy):
                self._made[t.device, t.policy] = _Input(part, False, {})
                continue
            if t.device not in prepared:
                prepared[t.device] = prepare(part)
            self._made[t.device, t.policy] = _Input(prepared[t.device], True, setting(part, t.policy, {}))

    def of(self, task: _Task) -> _Input:
        """What ``task`` searches."""
        return self._made[task.device, task.policy]


def _work(inputs: _Inputs, task: _Task) -> PolicyFit:
    made = inputs.of(task)
    try:
        return search(made.trace, task.policy, step=task.step, max_capacity=task.max_capacity, lb=task.lb,
                      options=made.options, counterfactual=made.counterfactual)
    except Exception as e:  # one policy failing must not hide the others' answers
        return PolicyFit(task.policy, None, task.lb, None, 0, task.max_capacity or _LIMIT,
                         error=f"{type(e).__name__}: {e}")


def whatif(
    trace: Trace,
    policies: Sequence[str] | None = None,
    *,
    max_capacity: int | None = None,
    step: int = STEP,
    jobs: int | None = None,
) -> WhatIfResult:
    """Smallest capacity per policy (per device); the (device, policy) searches run side by side on
    up to ``jobs`` threads (default: ``tracekit.workers.default_threads``, this thread alone when
    the work is small). A recording searched under a pool policy goes through the
    counterfactual prediction ``replay`` and ``advise`` make too, under its recorded setting;
    recorded settings that cannot be used end the command (``InputError``) before any search."""
    from tracekit.advise.counterfactual import setting, uses_counterfactual
    from tracekit.sim import policies as registry

    names = list(policies) if policies else registry.whatif_defaults()
    for name in names:
        registry.get(name)  # UsageError naming the valid policies
        if uses_counterfactual(trace, name):
            setting(trace, name, {})  # InputError naming the file: the recorded settings are unusable
    devs = device_ids(trace)
    keys: list[int | None] = list(devs) if len(devs) > 1 else [None]
    bounds = {d: lower_bound(select_device(trace, d) if d is not None else trace) for d in keys}
    tasks = [_Task(d, p, step, max_capacity, bounds[d]) for d in keys for p in names]
    fits = _run(trace, tasks, default_threads(jobs, tasks=len(tasks), events=len(trace.events),
                                              replays=len(tasks) * BISECT_REPLAYS))
    path = str(trace.path) if trace.path else None
    parts = []
    for d in keys:
        mine = tuple(f for t, f in zip(tasks, fits, strict=True) if t.device == d)
        ev_dev = int(trace.events.device[0]) if d is None and len(trace.events) else d
        parts.append(WhatIfResult(path, bounds[d], step, max_capacity, mine, device=ev_dev))
    if len(parts) == 1:
        return parts[0]
    return WhatIfResult(path, None, step, max_capacity, devices=tuple(parts))


def _run(trace: Trace, tasks: list[_Task], jobs: int) -> list[PolicyFit]:
    """The searches, in order: in this thread, or side by side on ``jobs`` threads (every replay
    kernel lets the GIL go; the inputs are made once, here, and shared)."""
    from functools import partial

    from tracekit.sim.scratch import WORK

    pool = Pool(jobs)
    try:
        with WORK.keeping():  # the replays' work arrays, lent from one replay to the next
            return list(pool.map(partial(_work, _Inputs(trace, tasks)), tasks))
    finally:
        pool.close()
