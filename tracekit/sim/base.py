"""The contract every simulated allocator policy implements.

A policy is one module under ``tracekit/sim/policies/`` exposing ``MODEL``, an
object satisfying ``AllocatorModel``. Its ``run`` replays the user-level
requests of a trace (``malloc``, ``free``; ``oom`` rows are replayed as malloc
attempts; input ``segment_*`` rows are ignored because the policy makes its
own) and returns a ``PolicyRun``: plain NumPy arrays filled by a compiled
kernel, no Python object per event. The engine (``tracekit.sim.engine``)
turns a ``PolicyRun`` into an output trace and a JSON summary, so a policy
never deals with Parquet, the CLI or output formatting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar, Protocol

import numpy as np

from tracekit.sim.allocators import Allocator
from tracekit.sim.codes import Stat, Status
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Source

__all__ = ["Allocator", "AllocatorModel", "Basis", "Layout", "PolicyRun", "PolicyTraits", "SimConfig",
           "Stat", "Status"]


class Layout(StrEnum):
    """What a policy's capacity bounds, and what its replay reports as reserved."""

    HEAP = "heap"  # one contiguous heap [0, capacity): reserved = the heap's high-water mark
    POOL = "pool"  # device allocations under a pool limit: reserved = bytes of live segments


class Basis(StrEnum):
    """What a policy's verdict (fits or not) rests on."""

    # The allocator's placement replayed: a request fails when no free block, and no new
    # device allocation under the limit, can hold it (fragmentation included).
    PLACEMENT = "placement"
    # The device's bytes at its granularity: every request is a device call, and one fails
    # only when those bytes do not fit (no external fragmentation, as the H200 showed for the
    # device allocator: docs/fidelity.md). advise reports such a verdict as modelled.
    FOOTPRINT = "footprint"


@dataclass(frozen=True)
class PolicyTraits:
    """What a policy says about itself; the CLI, whatif, advise and analysis read these, never names.

    ``recorded_limit``: without ``--capacity`` a replay runs under the pool
    limit the trace was recorded under. ``whatif``: searched by ``whatif`` (and
    ``advise``) when no policies are named. ``rank``: place in listings (help,
    whatif's table), ties by name. ``reproduces``: the source whose recorded
    allocator the policy models event for event (its fidelity is tested
    against those traces), None for a model of an idea. ``models``: the real
    allocator the policy models (None for a model of an idea); advise, device
    and analysis find a policy by it (``policies.modelling``), never by name.
    ``basis``: what a verdict rests on (``Basis``); advise ranks a footprint
    verdict after replayed ones and prices it at one device call per request and per free.
    """

    layout: Layout
    recorded_limit: bool = False
    whatif: bool = True
    rank: int = 100
    reproduces: Source | None = None
    models: Allocator | None = None
    basis: Basis = Basis.PLACEMENT


@dataclass(frozen=True)
class SimConfig:
    """Replay settings shared by all policies.

    ``capacity``: heap size for free-list policies, the pool limit for pools
    (CuPy ``set_limit``; PyTorch memory fraction x device total); None = unbounded.
    ``device_total``: the device under a pool (None = unbounded).
    ``options``: policy-specific settings, e.g. PyTorch's allocator config keys.
    ``stop_at_first_oom``: a request the program survived (a handled ``oom`` row, which a
    replay otherwise tries and goes on from, as the program did) stops the replay too.
    ``alike``: say at which capacities the replay is alike (``Stat.ASKED``, ``SAME_FROM``,
    ``SAME_BELOW``) also where that costs the replay time (first- and best-fit heaps: about
    15 %); the pool models whose limit enters only their limit test always say.
    ``per_event``: the run's per-event addresses and roundings (``PolicyRun.addr``, ``rounded``);
    off where only the summary is wanted (``replay`` without ``-o``): a policy may then leave them
    empty (the free lists do: 160 MB of fresh memory fewer for 10M events).
    """

    capacity: int | None = None
    device_total: int | None = None
    continue_on_oom: bool = False
    options: Mapping[str, str] = field(default_factory=dict)
    stop_at_first_oom: bool = False  # replay the requests the program survived as fatal ones too
    alike: bool = False  # advise's searches: where the replay is alike, at any cost
    per_event: bool = True  # PolicyRun.addr and rounded filled (off: the summary alone is wanted)


@dataclass(frozen=True, eq=False)
class PolicyRun:
    """Raw result of one policy over n input events.

    Per input event: ``addr`` (uint64, the simulated address of a placed
    malloc, 0 elsewhere; empty where ``SimConfig.per_event`` was off and the policy honours it) and
    ``status`` (int8, ``Status``). Allocator rows the
    policy emitted (``segment_alloc``, ``segment_free``) are parallel arrays:
    ``rows_before`` (int64, the input index the row is inserted before; n = at
    the end), ``rows_op`` (int8, ``Op`` code), ``rows_addr``, ``rows_size``,
    ``rows_stream`` (uint64), in emission order. ``stats`` is int64 indexed by ``Stat``.
    """

    addr: np.ndarray
    status: np.ndarray
    rows_before: np.ndarray
    rows_op: np.ndarray
    rows_addr: np.ndarray
    rows_size: np.ndarray
    rows_stream: np.ndarray
    stats: np.ndarray
    rounded: np.ndarray | None = None  # per input event, the policy's rounding (optional)


class AllocatorModel(Protocol):
    """One simulated allocator. ``name`` is the CLI name (``--sim NAME``)."""

    name: ClassVar[str]
    description: ClassVar[str]
    traits: ClassVar[PolicyTraits]

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun: ...
