"""The replay engine: run a trace through a named policy, summarize, write the replay.

``replay(trace, policy, config)`` looks the policy up in the registry
(``tracekit.sim.policies``), runs it and condenses its ``PolicyRun`` into a
``ReplaySummary``: peak live bytes (the largest sum of the allocated, rounded
sizes of live blocks), peak reserved bytes (device memory the allocator held;
for free lists and buddy the heap high-water mark, printed as such), peak
extent (the same number for a single heap: the highest end address ever in
use; None for pools), segment counts, and the first OOM with the free
bytes, largest free block, live and reserved bytes at that moment.
``write_replay`` turns the run into a v1 trace (``source: replay``) that the
analyzer reads like a recording. Repeated replays of one trace reuse its
prepared arrays (``tracekit.sim.prepare``), so ``fits`` is cheap to call in a
search over capacities.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit import interrupts
from tracekit.sim import policies
from tracekit.sim.base import PolicyRun, SimConfig, Stat
from tracekit.sim.result import OOMInfo, ReplayResult, ReplaySummary
from tracekit.trace.reader import Trace

if TYPE_CHECKING:
    from tracekit.sim.head_start import HeadStart


def replay(trace: Trace, policy: str, config: SimConfig | None = None,
           started: HeadStart | None = None) -> ReplayResult:
    """Replay ``trace`` through the policy named ``policy`` (UsageError if unknown); ``started``:
    the replay of the same policy and config begun while ``trace`` was read, taken where it agrees
    with the trace (``tracekit.sim.head_start``)."""
    config = config or SimConfig()
    with interrupts.deferred():  # a signal inside the compiled kernel's glue would crash it
        run = started.finish(trace) if started is not None else None
        if run is None:
            run = policies.get(policy).run(trace, config)
    warnings: tuple[str, ...] = ()
    dev = trace.events.device
    if len(dev) and dev.min() != dev.max():
        warnings = ("events of several devices, all replayed into one simulated allocator",)
    return ReplayResult(policy, config, run, summarize(trace, policy, config, run), warnings)


def fits(trace: Trace, policy: str, config: SimConfig) -> bool:
    """Whether the whole trace replays under ``policy`` with ``config`` without an OOM."""
    return not replay(trace, policy, replace(config, continue_on_oom=False)).ran_out


def summarize(trace: Trace, policy: str, config: SimConfig, run: PolicyRun) -> ReplaySummary:
    """The summary of ``run`` (a policy's raw result over ``trace``)."""
    s = [int(v) for v in run.stats]
    first = s[Stat.FIRST_OOM]
    oom = None
    if first >= 0:
        ev = trace.events
        rounded = s[Stat.OOM_ROUNDED]
        if rounded <= 0:  # a policy that leaves the slot empty: its per-event rounding, else the request
            per_event = run.rounded  # None or empty: the policy gives none, or none was wanted
            kept = per_event is not None and len(per_event) > first
            rounded = int(per_event[first]) if per_event is not None and kept else int(ev.size[first])
        oom = OOMInfo(
            seq=int(ev.seq[first]), size=int(ev.size[first]), rounded=rounded,
            free_bytes=s[Stat.OOM_FREE], largest_free_block=s[Stat.OOM_LARGEST],
            live_bytes=s[Stat.OOM_LIVE], reserved_bytes=s[Stat.OOM_RESERVED],
            room_bytes=max(0, config.capacity - s[Stat.OOM_RESERVED]) if config.capacity else None,
        )
    return ReplaySummary(
        policy=policy, capacity=config.capacity, device_total=config.device_total,
        events=len(trace.events), peak_live_bytes=s[Stat.PEAK_LIVE],
        peak_reserved_bytes=s[Stat.PEAK_RESERVED],
        peak_extent=s[Stat.PEAK_EXTENT] if s[Stat.PEAK_EXTENT] >= 0 else None,
        segment_allocs=s[Stat.SEGMENT_ALLOCS], segment_frees=s[Stat.SEGMENT_FREES],
        oom=oom, oom_count=s[Stat.OOMS], stopped=oom is not None and not config.continue_on_oom,
        handled_ooms=s[Stat.HANDLED],
    )


def write_replay(
    result: ReplayResult, trace: Trace, path: str | os.PathLike[str], *, command: str | None = None
) -> Path:
    """Write the replay as a v1 trace; see ``tracekit.sim.output`` for the rows."""
    from tracekit.sim.output import write_replay_trace

    return write_replay_trace(result, trace, Path(path), command=command)


__all__ = [
    "OOMInfo", "ReplayResult", "ReplaySummary", "fits", "replay", "summarize", "write_replay",
]
