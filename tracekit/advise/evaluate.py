"""One candidate, one replay: does it fit under the limit, at what peak and at what price.

Every candidate replays the trace through its registry policy at the limit; pools replay
it as counterfactual input, with device addresses ordered as a real run would order them
(``tracekit.advise.counterfactual``). What the verdict rests on is the policy's
``traits.basis``: a replay of the allocator's placement (``verified_by_replay`` True), or the
device's footprint (``MemoryAsyncPool`` and plain ``cudaMalloc``, the policies ``cupy-async``
and ``cuda``: the device allocator, which on the H200 showed no external fragmentation,
fits when the live bytes at its granularity fit; optimistic for the async pool, whose own
pool can fragment: ``docs/fidelity.md``), reported as modelled. ``price`` counts device
calls: segment allocations plus frees for pools (for expandable segments: pages mapped plus
unmapped), one call per request and per free for a footprint policy (each request is itself
the device call), none for a simulated heap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tracekit.advise.candidates import Candidate, Kind
from tracekit.advise.capacity import needed_requests
from tracekit.advise.verdict import Margin, Verdict, decide
from tracekit.sim import policies
from tracekit.sim.base import Basis, SimConfig
from tracekit.sim.codes import Stat
from tracekit.sim.engine import replay
from tracekit.trace.events import seq_row
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size


@dataclass(frozen=True)
class Outcome:
    """A candidate at one capacity (bytes). ``failed_at``: input index of the first OOM, None if it fits."""

    candidate: Candidate
    capacity: int | None
    fits: bool
    peak_reserved: int
    device_allocs: int
    device_frees: int
    failed_at: int | None
    verified_by_replay: bool
    heap: bool = False  # the policy is a single heap (it reports a peak extent)
    error: str | None = None
    handled_served: int = 0  # handled OOMs of the recording this replay served (the fallback model)
    verdict: Verdict | None = None  # set by ``judged``: the one decision every output shows
    margin: int | None = None  # the headroom FITS needs at this capacity (bytes)
    asked: int = -1  # the replay's ``Stat.ASKED``: from there up, and unbounded, the same steps
    same: tuple[int, int] = (-1, -1)  # its ``Stat.SAME_FROM`` and ``Stat.SAME_BELOW``: there, the same steps

    def judged(self, margin: Margin) -> Outcome:
        """This outcome with its verdict (``tracekit.advise.verdict.decide``) and margin in bytes."""
        v = decide(self.fits, self.error, self.headroom, self.capacity, margin)
        return replace(self, verdict=v, margin=margin.bytes_at(self.capacity) if self.capacity else None)

    @property
    def ok(self) -> bool:
        """The verdict is FITS (a judged outcome; an unjudged one falls back to the replay's answer)."""
        return self.verdict == Verdict.FITS if self.verdict is not None else self.fits

    @property
    def price(self) -> int:
        return self.device_allocs + self.device_frees

    @property
    def headroom(self) -> int | None:
        return None if self.capacity is None else self.capacity - self.peak_reserved

    def progress(self) -> tuple[int, int, int]:
        """Sort key, smaller is better: fits first, then a later failure, then a lower peak."""
        return (0 if self.fits else 1, -(self.failed_at if self.failed_at is not None else 1 << 62),
                self.peak_reserved)

    def label(self) -> str:
        if self.candidate.kind == Kind.CUPY_LIMIT and self.capacity:
            return f"CuPy pool, set_limit({format_size(self.capacity)})"
        return self.candidate.label()

    def to_dict(self) -> dict[str, Any]:
        return {
            "setting": self.label(), "kind": self.candidate.kind.value,
            "policy": self.candidate.policy, "options": self.candidate.opts,
            "capacity_bytes": self.capacity, "fits": self.ok,
            "verdict": (self.verdict or (Verdict.FITS if self.fits else Verdict.NO)).value,
            "gets_through": self.fits, "margin_bytes": self.margin, "handled_served": self.handled_served,
            # no headroom where the replay did not get through (its peak is where it stopped), as the
            # table and the report leave it blank
            "peak_reserved_bytes": self.peak_reserved, "headroom_bytes": self.headroom if self.fits else None,
            "device_allocs": self.device_allocs, "device_frees": self.device_frees, "price": self.price,
            "verified_by_replay": self.verified_by_replay,
        }


def release_rows(trace: Trace, site: str) -> np.ndarray:
    """Input rows of the allocations made at ``site`` (where free_all_blocks() would go)."""
    ev = trace.events
    try:
        k = ev.sites.index(site)
    except ValueError:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(((ev.op == Op.MALLOC) | (ev.op == Op.OOM)) & (ev.site == k))


def input_for(cand: Candidate, prepared: Trace) -> Trace:
    """The trace a candidate replays: ``prepared`` plus its own program releases, if any."""
    if cand.kind == Kind.CUPY_RELEASE and cand.site is not None:
        from tracekit.advise.counterfactual import with_release_before

        return with_release_before(prepared, release_rows(prepared, cand.site))
    return prepared


def evaluate(cand: Candidate, trace: Trace, capacity: int | None, device_total: int | None) -> Outcome:
    """``cand`` at ``capacity``; ``trace`` is the counterfactual input (raw traces: as read)."""
    assert cand.policy is not None
    src = input_for(cand, trace)
    # The summary alone is read: no per-event outputs (``SimConfig.per_event``).
    cfg = SimConfig(capacity=capacity, device_total=device_total, options=cand.opts, alike=True,
                    per_event=False)
    if cand.kind == Kind.FREE_LIST:
        res = replay(src, cand.policy, cfg)
    else:
        from tracekit.advise.counterfactual import counterfactual_replay

        src, res = counterfactual_replay(src, cand.policy, cfg)
    s = res.summary
    failed = None
    if s.oom is not None:
        failed = seq_row(src.events.seq, s.oom.seq)
    replayed = policies.get(cand.policy).traits.basis == Basis.PLACEMENT
    allocs, frees = (s.segment_allocs, s.segment_frees) if replayed else device_calls(src, failed)
    served = max(0, _handled_before(src, failed) - s.handled_ooms)
    asked = int(res.run.stats[Stat.ASKED])
    same = int(res.run.stats[Stat.SAME_FROM]), int(res.run.stats[Stat.SAME_BELOW])
    return Outcome(cand, capacity, s.oom is None, s.peak_reserved_bytes, allocs, frees, failed, replayed,
                   heap=s.peak_extent is not None, handled_served=served, asked=asked, same=same)


def _handled_before(trace: Trace, failed: int | None) -> int:
    """The handled OOMs of the recording before input row ``failed`` (all when None)."""
    from tracekit.trace.outcome import handled_rows

    return int(np.count_nonzero(handled_rows(trace.events, trace.meta.recorded)[slice(None, failed)]))


def device_calls(trace: Trace, failed: int | None) -> tuple[int, int]:
    """(requests, frees) before input row ``failed`` (all when None): a footprint policy's device
    calls, one per request the program needed (``needed_requests``) and one per ``free`` row."""
    ev = trace.events
    upto = slice(None, failed)
    return (int(np.count_nonzero(needed_requests(trace)[upto])),
            int(np.count_nonzero(ev.op[upto] == Op.FREE)))
