"""One candidate, one replay: does it fit under the limit, at what peak and at what price.

Pool and heap candidates replay the trace through the simulator at the limit; pools replay
it as counterfactual input, with device addresses ordered as a real run would order them
(``tracekit.advise.counterfactual``); ``verified_by_replay`` is then True.
``MemoryAsyncPool`` and plain ``cudaMalloc`` are not replayed: they are modelled as the
device allocator, which on the H200 showed no external fragmentation
(``docs/device-replay.md``), so their reserved bytes after every event are

    async:      ⌈Σ_live ⌈size/512⌉·512 / 2 MiB⌉ · 2 MiB   (the driver's pool maps 2 MiB pages)
    cudaMalloc: Σ_live cost(size), cost = ⌈size/512⌉·512 if size ≤ 1 MiB else ⌈size/2 MiB⌉·2 MiB

and they fit when the peak is within the limit (optimistic for the async pool, whose own
pool can fragment: ``docs/fidelity.md``). ``price`` counts device calls: segment
allocations plus frees for pools (for expandable segments: pages mapped plus unmapped), one
call per request and per free for cudaMalloc and the async pool, none for a simulated heap.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.advise.candidates import Candidate, Kind
from tracekit.advise.capacity import needed_requests
from tracekit.sim.base import SimConfig
from tracekit.sim.engine import replay
from tracekit.trace.live import live_bytes, paired_frees, round_up
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size

PAGE = 2 << 20
SMALL = 1 << 20


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
            "capacity_bytes": self.capacity, "fits": self.fits,
            "peak_reserved_bytes": self.peak_reserved, "headroom_bytes": self.headroom,
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
    if cand.kind in (Kind.CUPY_ASYNC, Kind.CUDA_MALLOC):
        return _device_model(cand, trace, capacity, device_total)
    assert cand.policy is not None
    src = input_for(cand, trace)
    cfg = SimConfig(capacity=capacity, device_total=device_total, options=cand.opts)
    if cand.kind == Kind.FREE_LIST:
        s = replay(src, cand.policy, cfg).summary
    else:
        from tracekit.advise.counterfactual import counterfactual_replay

        src, res = counterfactual_replay(src, cand.policy, cfg)
        s = res.summary
    failed = None
    if s.oom is not None:
        failed = int(np.searchsorted(src.events.seq, s.oom.seq))
    return Outcome(cand, capacity, s.oom is None, s.peak_reserved_bytes, s.segment_allocs, s.segment_frees,
                   failed, True, heap=s.peak_extent is not None)


def _device_model(cand: Candidate, trace: Trace, capacity: int | None, device_total: int | None) -> Outcome:
    ev = trace.events
    size = ev.size.astype(np.int64)
    if cand.kind == Kind.CUPY_ASYNC:
        cost = round_up(size)
    else:
        cost = np.where(size <= SMALL, round_up(size), round_up(size, PAGE))
    alloc = needed_requests(trace)
    held = live_bytes(cost, alloc, paired_frees(ev.op, trace.mate), trace.mate)
    if cand.kind == Kind.CUPY_ASYNC:
        held = round_up(held, PAGE)
    bound = min(b for b in (capacity, device_total, 1 << 62) if b is not None)
    over = np.flatnonzero(held > bound)
    upto = held[: over[0]] if len(over) else held
    calls = int(np.count_nonzero(alloc[: over[0]] if len(over) else alloc))
    nfree = int(np.count_nonzero((ev.op == Op.FREE)[: over[0]] if len(over) else ev.op == Op.FREE))
    peak = int(upto.max()) if len(upto) else 0
    return Outcome(cand, capacity, len(over) == 0, peak, calls, nfree,
                   int(over[0]) if len(over) else None, False)
