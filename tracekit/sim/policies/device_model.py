"""What the device-allocator models (``cuda``, ``cupy-async``) share: their ``run``.

Both replay a trace's requests against the device's granularity, not against an
allocator's placement (``Basis.FOOTPRINT``): the H200 showed no external fragmentation
of device memory (h200-facts §6: after filling the GPU with 4 GiB blocks and freeing
every other one, single requests of up to 90 % of free memory succeeded), so a request
fails only when its bytes, counted as the driver counts them, do not fit. The compiled
loop and its formulas are in ``_device_kernel``. The replay emits no allocator rows
(``segment_*``), as a device replay of the same allocator records none: each request is
itself the device call. ``SimConfig.capacity`` and ``device_total`` both bound the device
memory the allocator may take (the smaller one counts), as ``--capacity`` does for
``replay --device --allocator cuda|cupy-async``. No options.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tracekit import progress
from tracekit.errors import UsageError
from tracekit.sim.base import PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import NO_REFUSAL, Stat, named_vector
from tracekit.trace.reader import Trace

__all__ = ["DeviceModel"]


class DeviceModel:
    """Shared ``run`` of the device-allocator models; subclasses set name, traits and ``pooled``."""

    name: ClassVar[str]
    description: ClassVar[str]
    traits: ClassVar[PolicyTraits]
    pooled: ClassVar[bool]  # the async pool (pages of the live total, kept) or one cudaMalloc per block

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        if config.options:
            raise UsageError(f"policy {self.name} takes no options (got {', '.join(config.options)})")
        # Compiled, on first use (the registry's convention: importing a policy module loads no kernel).
        from tracekit.sim.policies import _device_kernel as k
        from tracekit.sim.pool_run import pool_stats
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        inp = prepare(trace)
        n = len(inp)
        bounds = [b for b in (config.capacity, config.device_total) if b is not None]
        cfg = named_vector(k.DeviceSetting, {
            k.DeviceSetting.BOUND: min(bounds) if bounds else 0, k.DeviceSetting.POOLED: self.pooled,
            k.DeviceSetting.CONTINUE: config.continue_on_oom,
        })
        state = np.array(k.new_state(), np.int64)
        addr, rounded, charge = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        status = np.zeros(n, np.int8)
        stats = pool_stats()
        kind, holder = attempt_kinds(inp, config.stop_at_first_oom), holders(inp)
        for lo, hi in progress.chunks(n):
            k.run_chunk(kind, inp.replaced_by, holder, inp.size, inp.mate, cfg, state, addr, status,
                        rounded, charge, stats, lo, hi)
            if state[k.DeviceSlot.STOPPED]:
                break
        if config.device_total is None:  # the bound is the capacity: say where the replay is alike
            stats[Stat.ASKED] = state[k.DeviceSlot.ASKED]
            stats[Stat.SAME_FROM] = state[k.DeviceSlot.PASSED]
            refused = state[k.DeviceSlot.REFUSED]
            stats[Stat.SAME_BELOW] = refused if refused > 0 else NO_REFUSAL
        empty = np.zeros(0, np.uint64)
        return PolicyRun(addr=addr.view(np.uint64), status=status, rows_before=np.zeros(0, np.int64),
                         rows_op=np.zeros(0, np.int8), rows_addr=empty, rows_size=empty, rows_stream=empty,
                         stats=stats, rounded=rounded.view(np.uint64))
