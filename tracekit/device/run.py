"""A device replay's settings (``DeviceConfig``) and its result (``DeviceRun``), for every frame.

Both replay frames (``tracekit.device.replay`` for the CUDA and CuPy
allocators, ``tracekit.device.torch_replay`` for PyTorch's) take the one and
return the other, so they live below both and neither frame imports the other
at load time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.device.allocators import SegmentLog
from tracekit.device.capacity import Allocator, CapacityPlan


@dataclass(frozen=True)
class DeviceConfig:
    """Replay settings: device ordinal, allocator, capacity (bytes, None = all free memory)."""

    device: int = 0
    allocator: Allocator = Allocator.CUDA
    capacity: int | None = None
    continue_on_oom: bool = False
    sample_every: int | None = None  # None: sampling_interval(n)
    options: Mapping[str, str] = field(default_factory=dict)  # torch: --torch-conf; rmm-pool: initial size
    stop_at_first_oom: bool = False  # a failed request the program survived stops the replay too


@dataclass(frozen=True, eq=False)
class DeviceRun:
    """What happened, per input event (arrays of length n) and per emitted allocator row.

    ``latency`` and ``t_end`` are ns (``t_end`` relative to the replay start;
    -1 latency = no call made); ``device_free`` is cudaMemGetInfo free bytes, -1
    where not sampled. ``free_start``/``free_end`` bracket the whole replay
    (equal when everything was given back); ``free_replay`` is the free memory
    the replay started with, after the ballast.
    """

    config: DeviceConfig
    plan: CapacityPlan
    status: np.ndarray
    addr: np.ndarray
    latency: np.ndarray
    t_end: np.ndarray
    device_free: np.ndarray
    rows: SegmentLog
    total: int
    free_start: int
    free_replay: int
    free_end: int
    peak_reserved: int | None
    ooms: int
    first_oom: int
    oom_state: dict[str, Any] | None
    torch: Any = None  # torch_replay.TorchRun for the torch allocator
    handled_ooms: int = 0  # failed requests the program survived too (the replay went on past them)
