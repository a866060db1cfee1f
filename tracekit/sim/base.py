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
from enum import IntEnum
from typing import ClassVar, Protocol

import numpy as np

from tracekit.trace.reader import Trace


class Status(IntEnum):
    """What happened to each input event during a replay."""

    IGNORED = 0  # not a user request (segment row), or after the replay stopped
    DONE = 1  # malloc (or a replayed oom row) placed, or free performed
    OOM = 2  # the request could not be placed: emitted as an ``oom`` row
    SKIPPED = 3  # a free whose malloc failed earlier (--continue-on-oom)


class Stat(IntEnum):
    """Slots of ``PolicyRun.stats`` (int64). Bytes unless noted; -1 = not applicable."""

    PEAK_LIVE = 0  # max over time of the allocated (rounded) sizes of live blocks
    PEAK_RESERVED = 1  # max device memory held: segments for pools, heap high-water for lists
    PEAK_EXTENT = 2  # free lists: highest end address ever in use; pools: -1
    SEGMENT_ALLOCS = 3  # count of segment_alloc rows emitted
    SEGMENT_FREES = 4  # count of segment_free rows emitted
    OOMS = 5  # count of failed requests
    FIRST_OOM = 6  # input index of the first failed request, -1 if none
    OOM_FREE = 7  # at the first OOM: free bytes the policy held (reserved - live, or heap free)
    OOM_LARGEST = 8  # at the first OOM: largest free block usable for that request
    OOM_LIVE = 9  # at the first OOM: live bytes
    OOM_RESERVED = 10  # at the first OOM: reserved bytes
    OOM_ROUNDED = 11  # at the first OOM: the request after the policy's rounding


@dataclass(frozen=True)
class SimConfig:
    """Replay settings shared by all policies.

    ``capacity``: heap size for free-list policies, the pool limit for pools
    (CuPy ``set_limit``; PyTorch memory fraction x device total); None = unbounded.
    ``device_total``: the device under a pool (None = unbounded).
    ``options``: policy-specific settings, e.g. PyTorch's allocator config keys.
    """

    capacity: int | None = None
    device_total: int | None = None
    continue_on_oom: bool = False
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class PolicyRun:
    """Raw result of one policy over n input events.

    Per input event: ``addr`` (uint64, the simulated address of a placed
    malloc, 0 elsewhere) and ``status`` (int8, ``Status``). Allocator rows the
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

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun: ...
