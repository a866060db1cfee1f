"""Replaying a trace's requests on a real GPU: capacity, the replay frame and its cleanup.

``replay_on_device(trace, config)`` runs the user-level requests (``malloc``,
``free``; ``oom`` rows are replayed as malloc attempts; input ``segment_*``
rows are ignored because the real allocator makes its own) through one real
allocator and returns a ``DeviceRun`` of NumPy arrays, the device-side
counterpart of the simulator's ``PolicyRun``. Per request: status, the real
address, ``latency_ns`` (``perf_counter_ns`` around the one call) and the end
time; ``device_free`` (cudaMemGetInfo) is sampled every ``sample_every``
requests (default: n // 1000 clamped to [1, 1000], so every trace gets about
min(n, 1000) samples or more), at every segment row and at every OOM (the
loops themselves are in ``tracekit.device.loops``). Everything taken (ballast,
live blocks, pool memory) is given back in a ``finally``, also on Ctrl-C and
SIGTERM; one failed release does not keep the others from running. The
``torch`` allocator has its own frame (``tracekit.device.torch_replay``): its
rows come from PyTorch's memory history rather than from a hook, and
``device_free`` is not sampled at them. The settings and the result
(``DeviceConfig``, ``DeviceRun``) live in ``tracekit.device.run``, which both
frames import, and are named here too.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tracekit.device.allocators import AsyncPool, ObservedPool, SegmentLog, Upstream
from tracekit.device.capacity import (
    Allocator,
    Ballast,
    deferred_signals,
    plan_capacity,
)
from tracekit.device.loops import Attempts, Loop, loop_cuda, loop_pool, replay_streams
from tracekit.device.rmm_backend import RmmPool
from tracekit.device.run import DeviceConfig, DeviceRun
from tracekit.errors import DeviceError
from tracekit.gpu.cuda import check_device, import_cupy
from tracekit.trace.reader import Trace

__all__ = ["Allocator", "DeviceConfig", "DeviceRun", "replay_on_device"]


def replay_on_device(trace: Trace, cfg: DeviceConfig) -> DeviceRun:
    """Replay ``trace`` on ``cfg.device``; everything taken is released before returning or raising."""
    if cfg.allocator is Allocator.TORCH:
        from tracekit.device.torch_replay import replay_torch

        return replay_torch(trace, cfg)
    cupy = import_cupy("device replay needs CuPy and a GPU")
    rt = cupy.cuda.runtime
    ev = trace.events
    ops = ev.op.astype(np.int64)
    sizes, mates = ev.size.astype(np.int64), trace.mate.astype(np.int64)
    check_device(rt, cfg.device, "--device")
    with cupy.cuda.Device(cfg.device), deferred_signals() as pending:
        objs = replay_streams(ops, ev.stream) if cfg.allocator is not Allocator.CUDA else {}
        free_start, total = (int(x) for x in rt.memGetInfo())
        plan = plan_capacity(cfg.allocator, cfg.capacity, free_start, total)
        log = SegmentLog()
        lp = Loop(len(ev), cfg.continue_on_oom, cfg.sample_every, pending,
                  Attempts.of(trace, cfg.stop_at_first_oom))
        ballast = Ballast(plan.ballast_bytes)
        backend: ObservedPool | AsyncPool | RmmPool | None = None
        try:
            if cfg.allocator is Allocator.CUPY:
                backend = ObservedPool(log, plan.pool_limit)
            elif cfg.allocator is Allocator.CUPY_ASYNC:
                backend = AsyncPool(cfg.device)
            elif cfg.allocator is Allocator.RMM_POOL:
                backend = RmmPool(log, plan.pool_limit, _rmm_initial(trace, plan.pool_limit, cfg.options))
            free_replay = int(rt.memGetInfo()[0])
            t_start = time.perf_counter_ns()
            if backend is None:
                loop_cuda(lp, ops, sizes, mates)
            else:
                loop_pool(lp, ops, sizes, mates, ev.stream, backend, objs)
            peak = _peak_reserved(cfg.allocator, backend, lp, free_replay)
        except BaseException as e:
            for err in release_all(rt, lp, backend, ballast):  # the replay's own error says what failed
                e.add_note(f"also while releasing device memory: {err}")
            raise
        errors = release_all(rt, lp, backend, ballast)
        if errors:
            raise DeviceError(f"device {cfg.device}: could not give back all memory after the replay "
                              f"({len(errors)} error(s), first: {errors[0]})")
        free_end = int(rt.memGetInfo()[0])
    lp.t_end[lp.t_end > 0] -= t_start
    if len(log):
        log.t_end[:] = [t - t_start for t in log.t_end]
    return DeviceRun(cfg, plan, lp.status, lp.addr, lp.latency, lp.t_end, lp.device_free, log, total,
                     free_start, free_replay, free_end, peak, lp.ooms, lp.first_oom, lp.oom_state,
                     handled_ooms=lp.handled_ooms)


def _rmm_initial(trace: Trace, maximum: int | None, options: Mapping[str, str]) -> int:
    """The initial pool the ``rmm-pool`` model starts with for this trace, maximum and options
    (``initial_pool_size``, as advise's candidate gives it)."""
    from tracekit.sim.base import SimConfig
    from tracekit.sim.policies.rmm_pool import initial_pool_size

    return initial_pool_size(trace, SimConfig(capacity=maximum, options=dict(options)))


def _peak_reserved(alloc: Allocator, backend: Any, lp: Loop, free_replay: int) -> int | None:
    """cupy, rmm-pool: exact from the segment rows; cupy-async: the pool's high-water mark; cuda:
    sampled."""
    if isinstance(backend, Upstream):
        return backend.peak_reserved
    if isinstance(backend, AsyncPool):
        return backend.peak_reserved
    sampled = lp.device_free[lp.device_free >= 0]
    return int(free_replay - sampled.min()) if len(sampled) else 0


def release_all(rt: Any, lp: Loop, backend: ObservedPool | AsyncPool | RmmPool | None,
                ballast: Any) -> list[str]:
    """Give back every live block, all pool memory and the ballast; returns the errors met.

    Each step runs whatever the others did (one failed cudaFree must not keep the
    remaining blocks or the ballast), and the ballast goes back even on Ctrl-C here.
    """
    errors: list[str] = []

    def attempt(what: str, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:
            errors.append(f"{what}: {e}")

    try:
        if backend is None:  # cudaMalloc'd pointers, those standing in for a retry too
            ptrs = list(lp.live.values()) + list(lp.standing.values())
            lp.live.clear()
            lp.standing.clear()
            for p in ptrs:
                attempt(f"cudaFree({int(p):#x})", rt.free, p)
        else:
            if isinstance(backend, Upstream):
                backend.recording = False
            lp.live.clear()
            lp.standing.clear()  # served attempts standing in for their retries hold blocks too
            attempt("releasing the pool", backend.release)
        attempt("cudaDeviceSynchronize", rt.deviceSynchronize)
    finally:
        attempt("releasing the ballast", ballast.release)
    return errors
