"""``rmm-pool``: RMM's ``pool_memory_resource`` (rapidsai/rmm) as a simulated allocator.

Read from RMM's source (``cpp/src/mr/detail/pool_memory_resource_impl.cpp``,
``cpp/include/rmm/mr/detail/stream_ordered_memory_resource.hpp``, ``coalescing_free_list.hpp``;
the compiled loop and the exact rules are ``_rmm_kernel``'s): requests aligned up to 256 bytes;
one free list per stream, best fit with ties to the lowest address, a block's rest kept on its
list; a miss looks at every other stream's list, then merges them into the request's, then grows
the pool by ``size_to_grow`` (``max(request, remaining / 2)`` under a maximum pool size,
``max(request, pool size)`` without), halving while the device refuses; frees coalesce with
neighbours on the freeing stream's list, never across two upstream blocks; the pool never shrinks.

``SimConfig.capacity`` is ``maximum_pool_size`` (aligned down to 256 bytes, as RMM requires a
multiple of 256; None: no maximum). ``SimConfig.device_total`` bounds the upstream
(``cuda_memory_resource``) at the driver's granularity. Options (``SimConfig.options``):
``initial_pool_size`` (bytes, or a size such as ``1GiB``; default: the program's own initial pool
where ``record --rmm`` measured it, else as RMM's: half the device's free memory, aligned down to
256, where the trace records it, else 0). An initial size above the
maximum is taken as the maximum (RMM's constructor refuses it).

Streams: the default stream (0) and ``cudaStreamLegacy`` (1) share one list, as
``get_event`` stores both as the legacy stream; the per-thread default stream (2) has one list per
thread (the trace's ``thread`` column, ``import rmm``), as RMM keeps its events thread-local.
Not modelled: the order RMM visits the other lists in (a map keyed by CUDA event handles; here
the order the lists came into use), the synchronization those steals cost, and the addresses
(the upstream's are invented, so equal-size best fits in two upstream blocks may tie the other way).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tracekit.errors import UsageError
from tracekit.sim.base import Allocator, Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import named_vector
from tracekit.trace.arrow import filled
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Source
from tracekit.units import parse_size

LEGACY = 1  # cudaStreamLegacy; the default stream (0) is stored as it
PER_THREAD = 2  # cudaStreamPerThread


def stream_lists(stream: np.ndarray, thread: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its free list (int64), and the stream value of each list (uint64, list 0 legacy's).

    Lists are numbered in the order of their first row; the per-thread default stream has one per
    thread (``thread`` None: one for all)."""
    s = np.where(stream == 0, np.uint64(LEGACY), stream).astype(np.uint64)
    ptds = s == PER_THREAD
    t = thread if thread is not None and ptds.any() else np.zeros(len(s), np.uint64)
    key = np.stack([s, np.where(ptds, t, np.uint64(0))], axis=1)
    key = np.concatenate([np.array([[LEGACY, 0]], np.uint64), key])  # list 0: the legacy stream's
    uniq, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # by first use
    rank = np.empty(len(order), np.int64)
    rank[order] = np.arange(len(order))
    group = rank[inverse.reshape(-1)]
    return group[1:].astype(np.int64), uniq[order, 0].astype(np.uint64)


def _thread(trace: Trace) -> np.ndarray | None:
    tbl = trace.extras
    if tbl is None or "thread" not in tbl.column_names:
        return None
    return filled(tbl.column("thread"), 0).astype(np.uint64, copy=False)


def initial_pool_size(trace: Trace, config: SimConfig) -> int:
    """The initial pool size of a replay: the option, else the recorded program's, else half the
    recorded free memory, else 0."""
    from tracekit.sim.policies._rmm_kernel import ALIGNMENT  # the kernels load on run (package docstring)

    text = config.options.get("initial_pool_size")
    recorded = trace.meta.recorded.rmm_pool.initial_bytes  # record --rmm measured the program's pool
    if text is not None:
        value = parse_size(str(text), "rmm-pool option initial_pool_size")
    elif recorded is not None:
        value = recorded
    else:
        dev = trace.meta.device
        free = dev.free_bytes if dev is not None and dev.free_bytes else 0
        value = free // 2  # percent_of_free_device_memory(50)
    value = value // ALIGNMENT * ALIGNMENT
    if config.capacity is not None:
        value = min(value, int(config.capacity) // ALIGNMENT * ALIGNMENT)
    return value


class RmmPool:
    """RMM's ``pool_memory_resource`` over ``cuda_memory_resource``, one device."""

    name: ClassVar[str] = "rmm-pool"
    description: ClassVar[str] = (
        "RMM pool_memory_resource: 256 B alignment, per-stream coalescing best-fit lists, steals from "
        "other streams, grows by max(request, remaining/2) under maximum_pool_size"
    )
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.POOL, recorded_limit=True, whatif=False, rank=9,
                                                 reproduces=Source.RMM, models=Allocator.RMM_POOL)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        return self.run_with_state(trace, config)[0]

    def run_with_state(self, trace: Trace, config: SimConfig) -> tuple[PolicyRun, np.ndarray, np.ndarray,
                                                                       np.ndarray]:
        """The run, plus the final chunk store, its counters and the ``Found`` counts (for checks)."""
        from tracekit.sim import chunks as ck
        from tracekit.sim import segments as sg
        from tracekit.sim.policies._rmm_kernel import (
            ALIGNMENT,
            NO_MAXIMUM,
            TOP_ADDR,
            Found,
            RmmSetting,
            rmm_replay,
        )
        from tracekit.sim.pool_run import capacity_for_state, pack, pool_stats
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        unknown = sorted(set(config.options) - {"initial_pool_size"})
        if unknown:
            raise UsageError(f"unknown rmm-pool option {unknown[0]!r} (rmm-pool takes initial_pool_size)")
        initial = initial_pool_size(trace, config)
        total = config.device_total or 0
        if total and sg.device_cost(initial) > total:
            raise UsageError(f"rmm-pool: the initial pool of {initial} bytes does not fit the device's "
                             f"{total} bytes (RMM's constructor fails)")
        ev = trace.events
        inp = prepare(trace)
        group, group_stream = stream_lists(ev.stream, _thread(trace))
        cap, rows_cap = capacity_for_state(trace)
        C, R, S = ck.new_state(cap, rows_cap, TOP_ADDR)  # addresses fall from TOP_ADDR
        stats = pool_stats()
        found = np.zeros(len(Found), np.int64)
        maximum = NO_MAXIMUM if config.capacity is None else int(config.capacity) // ALIGNMENT * ALIGNMENT
        cfg = named_vector(RmmSetting, {
            RmmSetting.INITIAL: initial, RmmSetting.MAXIMUM: maximum, RmmSetting.DEVICE_TOTAL: total,
            RmmSetting.CONTINUE: config.continue_on_oom,
        })
        addr, status, rounded, C, R = rmm_replay(
            ev.op, attempt_kinds(inp, config.stop_at_first_oom), inp.replaced_by, holders(inp), inp.size,
            group, len(group_stream), group_stream.view(np.int64), trace.mate, cfg, C, R, S, stats, found,
        )
        return pack(addr, status, rounded, R, S, stats), C, S, found


MODEL = RmmPool()
