"""What-if: the smallest capacity at which each simulated allocator replays a trace without OOM.

For each policy the search replays the trace (``tracekit.sim.engine.fits``)
at capacities that are multiples of ``step`` (2 MiB, the device's own
allocation granularity) and bisects between a capacity known to fail and
one known to fit:

- lower bound LB = max over time of Σ ⌈requested / 512⌉ · 512 over live
  requests, counting ``oom`` rows as requests that stay live (the replay
  retries them). Every policy rounds to at least 512 bytes, so no allocator
  can succeed below LB; the largest multiple of ``step`` below LB is the
  first known failure.
- upper end: the peak reserved bytes of an unbounded replay, rounded up to
  ``step`` (doubled until the replay fits, up to ``max_capacity``).

The answer C is verified: the trace fits at C and fails at C − step (more
capacity is assumed never to hurt; the two replays next to the answer check
it locally). LB is a floor for every allocator, so the search never goes
below it, also for a trace that starts from an imported pool state (PyTorch
snapshots: the ``initial`` extra column), whose starting blocks a replay does
not re-check against the capacity. ``overhead`` = C − LB, ``overhead_ratio`` = C / LB − 1. Policies
run in parallel worker processes; each worker reads the trace once.

A trace of several devices is searched per device (each device's events alone, its own
bound and capacities): devices never share one simulated address space.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracekit import progress
from tracekit.errors import TracekitError
from tracekit.sim.heap import round_up
from tracekit.trace.devices import device_ids, select_device
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Op
from tracekit.units import format_size
from tracekit.workers import BISECT_REPLAYS, default_jobs, process_context

STEP = 2 << 20
LOWER_BOUND_DESCRIPTION = (
    "peak live bytes (512 B rounded): max over time of the sum of requests rounded up to 512 B, "
    "oom rows counted as live"
)
_LIMIT = 1 << 50  # 1 PiB: where the doubling search gives up


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy, "min_capacity_bytes": self.min_capacity,
            "overhead_bytes": self.overhead, "overhead_ratio": self.overhead_ratio,
            "unbounded_peak_reserved_bytes": self.unbounded_peak_reserved,
            "replays": self.replays, "searched_up_to_bytes": self.searched_up_to, "error": self.error,
        }


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

    def to_dict(self) -> dict[str, Any]:
        d = {
            "trace": self.trace, "device": self.device, "lower_bound_bytes": self.lower_bound,
            "lower_bound_description": LOWER_BOUND_DESCRIPTION, "step_bytes": self.step,
            "max_capacity_bytes": self.max_capacity, "policies": [f.to_dict() for f in self.fits],
        }
        if self.devices:
            d["devices"] = [p.to_dict() for p in self.devices]
        return d

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
                assert f.overhead is not None and f.overhead_ratio is not None
                sign = "+" if f.overhead >= 0 else "-"
                over = f"{sign}{format_size(abs(f.overhead))} ({f.overhead_ratio:+.1%})"
                rows.append((f.policy, format_size(f.min_capacity), over, str(f.replays)))
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = [f"lower bound (peak live bytes, 512 B rounded): {format_size(self.lower_bound)}"]
        lines += [f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}" for r in rows]
        from tracekit.sim import policies as registry

        pools = [f.policy for f in self.fits if registry.is_pool(f.policy)]
        note = f"; for {' and '.join(pools)} the capacity is the pool limit" if pools else ""
        lines.append(f"(capacities in steps of {format_size(self.step)}{note})")
        return "\n".join(lines)


def lower_bound(trace: Trace) -> int:
    """Peak of Σ ⌈requested/512⌉·512 over live requests; oom rows count as requests that stay live."""
    live = live_curve(trace)
    return int(max(0, live.max())) if len(live) else 0


def live_curve(trace: Trace) -> np.ndarray:
    """Σ ⌈requested/512⌉·512 over live requests after every event (int64, bytes)."""
    ev = trace.events
    req = round_up(ev.size.astype(np.int64))
    alloc = (ev.op == Op.MALLOC) | (ev.op == Op.OOM)
    delta = np.where(alloc, req, 0)
    frees = np.flatnonzero((ev.op == Op.FREE) & (trace.mate >= 0))
    delta[frees] = -req[trace.mate[frees]]
    return np.cumsum(delta)


def search(trace: Trace, policy: str, *, step: int = STEP, max_capacity: int | None = None,
           lb: int | None = None, options: Mapping[str, str] | None = None) -> PolicyFit:
    """Bisection for one policy (see the module docstring); ``options`` are the policy's settings."""
    from tracekit.sim.base import SimConfig
    from tracekit.sim.engine import fits, replay

    lb = lower_bound(trace) if lb is None else lb
    limit = max_capacity if max_capacity is not None else _LIMIT
    opts = dict(options or {})
    unbounded = replay(trace, policy, SimConfig(options=opts)).summary.peak_reserved_bytes
    replays = 1
    lo = (lb - 1) // step * step if lb > 0 else -step  # largest multiple of step below lb: fails
    hi = max(round_up(max(unbounded, 1), step), lo + step)
    while True:
        if hi > limit:
            hi = limit // step * step
            replays += 1
            if hi <= lo or not fits(trace, policy, SimConfig(capacity=hi, options=opts)):
                return PolicyFit(policy, None, lb, unbounded, replays, limit)
            break
        replays += 1
        if fits(trace, policy, SimConfig(capacity=hi, options=opts)):
            break
        lo, hi = hi, hi * 2
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        replays += 1
        if fits(trace, policy, SimConfig(capacity=mid, options=opts)):
            hi = mid
        else:
            lo = mid
    return PolicyFit(policy, max(hi, 0), lb, unbounded, replays, limit)


_WORKER_TRACE: Trace | None = None


def _init_worker(path: str | None, trace: Trace | None, device: int | None) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = read_trace(path) if path is not None else trace
    if _WORKER_TRACE is not None and device is not None:
        _WORKER_TRACE = select_device(_WORKER_TRACE, device)


def _work(policy: str, step: int, max_capacity: int | None, lb: int) -> PolicyFit:
    assert _WORKER_TRACE is not None
    try:
        return search(_WORKER_TRACE, policy, step=step, max_capacity=max_capacity, lb=lb)
    except Exception as e:  # one policy failing must not hide the others' answers
        return PolicyFit(policy, None, lb, None, 0, max_capacity or _LIMIT, error=f"{type(e).__name__}: {e}")


def whatif(
    trace: Trace,
    policies: Sequence[str] | None = None,
    *,
    max_capacity: int | None = None,
    step: int = STEP,
    jobs: int | None = None,
) -> WhatIfResult:
    """Smallest capacity per policy (per device); policies run in up to ``jobs`` processes
    (default: ``tracekit.workers.default_jobs``, in this process when the work is small)."""
    from tracekit.sim import policies as registry

    names = list(policies) if policies else registry.whatif_defaults()
    for name in names:
        registry.get(name)  # UsageError naming the valid policies
    devs = device_ids(trace)
    if len(devs) <= 1:
        return _whatif_device(trace, names, None, max_capacity, step, jobs)
    parts = tuple(_whatif_device(trace, names, d, max_capacity, step, jobs) for d in devs)
    return WhatIfResult(parts[0].trace, None, step, max_capacity, devices=parts)


def _whatif_device(whole: Trace, names: list[str], device: int | None, max_capacity: int | None,
                   step: int, jobs: int | None) -> WhatIfResult:
    """The search over one device's events (``device`` None: the trace has one device)."""
    trace = select_device(whole, device) if device is not None else whole
    lb = lower_bound(trace)
    jobs = default_jobs(jobs, tasks=len(names), events=len(trace.events),
                        replays=len(names) * BISECT_REPLAYS)
    if jobs == 1:
        _init_worker(None, trace, None)
        try:
            fits = []
            for i, p in enumerate(names):
                with progress.part(i, len(names)):  # each replay of the search moves the bar within the part
                    fits.append(_work(p, step, max_capacity, lb))
        finally:
            _init_worker(None, None, None)  # do not keep the trace alive in this process
    else:
        # Workers read the file themselves when there is one (cheaper than pickling the events).
        path = str(trace.path) if trace.path is not None and Path(trace.path).exists() else None
        try:
            with ProcessPoolExecutor(jobs, mp_context=process_context(), initializer=_init_worker,
                                     initargs=(path, None if path else trace, device)) as pool:
                fits = []
                for fit in pool.map(_work, names, [step] * len(names), [max_capacity] * len(names),
                                    [lb] * len(names)):
                    fits.append(fit)
                    progress.report(len(fits), len(names))  # policies searched, in order
        except BrokenProcessPool:  # a worker killed (the OOM killer, a signal): say so, no traceback
            raise TracekitError(f"{trace.path or 'the trace'}: a what-if worker process ended abruptly "
                                "(out of memory or killed)") from None
    return WhatIfResult(str(trace.path) if trace.path else None, lb, step, max_capacity, tuple(fits),
                        device=int(trace.events.device[0]) if len(trace.events) else None)
