"""Replaying a trace's requests on a real GPU: the timed loops and the capacity/cleanup frame.

``replay_on_device(trace, config)`` runs the user-level requests (``malloc``,
``free``; ``oom`` rows are replayed as malloc attempts; input ``segment_*``
rows are ignored because the real allocator makes its own) through one real
allocator and returns a ``DeviceRun`` of NumPy arrays, the device-side
counterpart of the simulator's ``PolicyRun``. Per request: status, the real
address, ``latency_ns`` (``perf_counter_ns`` around the one call) and the end
time; ``device_free`` (cudaMemGetInfo) is sampled every ``sample_every``
requests (default: n // 1000 clamped to [1, 1000], so every trace gets about
min(n, 1000) samples or more), at every segment row and at every OOM. The
loops work in chunks of ``CHUNK`` events turned into Python lists, so per-event work is a few list
operations around the CUDA call and no Python object outlives its chunk,
whatever the trace length. Everything taken (ballast, live blocks, pool
memory) is given back in a ``finally``, also on Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.device.allocators import AsyncPool, ObservedPool, SegmentLog
from tracekit.device.capacity import (
    Allocator,
    Ballast,
    CapacityPlan,
    PendingSignal,
    deferred_signals,
    plan_capacity,
)
from tracekit.errors import DeviceError
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

CHUNK = 1 << 16
_CUDA_OOM = 2  # cudaErrorMemoryAllocation


@dataclass(frozen=True)
class DeviceConfig:
    """Replay settings: device ordinal, allocator, capacity (bytes, None = all free memory)."""

    device: int = 0
    allocator: Allocator = Allocator.CUDA
    capacity: int | None = None
    continue_on_oom: bool = False
    sample_every: int | None = None  # None: sampling_interval(n)


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


class _Loop:
    """Mutable state shared by the loops: output arrays, live blocks, OOM bookkeeping."""

    def __init__(self, n: int, cfg: DeviceConfig, pending: PendingSignal) -> None:
        self.cfg = cfg
        self.pending = pending
        self.every = cfg.sample_every or sampling_interval(n)
        self.status = np.zeros(n, np.int8)
        self.addr = np.zeros(n, np.uint64)
        self.latency = np.full(n, -1, np.int64)
        self.t_end = np.zeros(n, np.int64)
        self.device_free = np.full(n, -1, np.int64)
        self.live: dict[int, Any] = {}
        self.ooms = 0
        self.first_oom = -1
        self.oom_state: dict[str, Any] | None = None

    def flush(self, base: int, addr: list, t0: list, t1: list, stat: list, dfree: dict,
              stop: int | None = None) -> None:
        """Copy one chunk's lists into the arrays; with ``stop``, events from there on were not run."""
        n = len(stat) if stop is None else stop
        sl = slice(base, base + n)
        a1 = np.asarray(t1[:n], np.int64)
        self.addr[sl] = addr[:n]
        self.latency[sl] = np.where(a1 > 0, a1 - np.asarray(t0[:n], np.int64), -1)
        self.t_end[sl] = a1
        self.status[sl] = stat[:n]
        if dfree:
            idx = np.fromiter(dfree.keys(), np.int64, len(dfree))
            keep = idx < n
            self.device_free[idx[keep] + base] = np.fromiter(dfree.values(), np.int64, len(dfree))[keep]

    def note_oom(self, i: int, err: BaseException, free: int, stats: dict[str, Any] | None) -> bool:
        """Record an OOM at input index i; return True when the replay must stop."""
        from cupy.cuda import runtime

        if isinstance(err, runtime.CUDARuntimeError) and err.status != _CUDA_OOM:
            raise DeviceError(f"CUDA error at event {i}: {err}") from None
        self.ooms += 1
        if self.first_oom < 0:
            self.first_oom = i
            self.oom_state = {"device_free": free, "error": str(err), **(stats or {})}
        return not self.cfg.continue_on_oom


def sampling_interval(n: int) -> int:
    """Requests between two cudaMemGetInfo samples: n // 1000 clamped to [1, 1000]."""
    return max(1, min(1000, n // 1000))


def _chunks(n: int) -> range:
    return range(0, n, CHUNK)


def _loop_cuda(lp: _Loop, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray) -> None:
    """cudaMalloc/cudaFree per request; the hot loop is kept to list indexing and two clock reads."""
    from cupy.cuda import runtime as rt

    malloc, free, meminfo, clock, err_t = rt.malloc, rt.free, rt.memGetInfo, time.perf_counter_ns, \
        rt.CUDARuntimeError
    live, every = lp.live, lp.every
    k = every
    for base in _chunks(len(ops)):
        o_arr = ops[base:base + CHUNK]
        o_l, s_l, m_l = o_arr.tolist(), sizes[base:base + CHUNK].tolist(), mates[base:base + CHUNK].tolist()
        n = len(o_l)
        addr, t0l, t1l = [0] * n, [0] * n, [0] * n
        stat = _default_status(o_arr)
        dfree: dict[int, int] = {}
        for j in range(n):
            o = o_l[j]
            if o == 1:
                p = live.pop(m_l[j], None)
                if p is None:
                    stat[j] = 3  # its malloc failed (--continue-on-oom)
                    continue
                t0 = clock()
                free(p)
                t1 = clock()
            elif o == 0 or o == 4:
                t0 = clock()
                try:
                    p = malloc(s_l[j])
                except err_t as e:
                    t1l[j], t0l[j], stat[j] = clock(), t0, 2
                    dfree[j] = meminfo()[0]
                    if lp.note_oom(base + j, e, dfree[j], None):
                        lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                        return
                    continue
                t1 = clock()
                live[base + j] = p
            else:
                continue
            addr[j] = p
            t0l[j] = t0
            t1l[j] = t1
            k -= 1
            if k == 0:
                k = every
                dfree[j] = meminfo()[0]
                if lp.pending.signum:  # Ctrl-C / SIGTERM: stop here, where the live map is complete
                    lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                    lp.pending.check()
        lp.flush(base, addr, t0l, t1l, stat, dfree)


def _default_status(o_arr: np.ndarray) -> list:
    """DONE for requests (malloc, free, oom), IGNORED for the input's own segment rows."""
    return ((o_arr == Op.MALLOC) | (o_arr == Op.FREE) | (o_arr == Op.OOM)).astype(np.int8).tolist()


def _loop_pool(lp: _Loop, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray, streams: np.ndarray,
               backend: ObservedPool | AsyncPool) -> None:
    """Pool malloc per request; a free is dropping the last reference to its MemoryPointer."""
    import cupy
    from cupy.cuda import memory
    from cupy.cuda import runtime as rt

    meminfo, clock = rt.memGetInfo, time.perf_counter_ns
    pool_malloc = backend.pool.malloc
    observed = backend if isinstance(backend, ObservedPool) else None
    errs = (memory.OutOfMemoryError, rt.CUDARuntimeError)
    live, every = lp.live, lp.every
    k = every
    uniq = np.unique(streams[(ops == Op.MALLOC) | (ops == Op.OOM)])
    objs = {int(s): (cupy.cuda.Stream.null if s == 0 else cupy.cuda.Stream()) for s in uniq}
    multi = len(objs) > 1
    cur = -1
    try:
        for base in _chunks(len(ops)):
            o_arr = ops[base:base + CHUNK]
            o_l, s_l, m_l, st_l = (a[base:base + CHUNK].tolist() for a in (ops, sizes, mates, streams))
            n = len(o_l)
            addr, t0l, t1l = [0] * n, [0] * n, [0] * n
            stat = _default_status(o_arr)
            dfree: dict[int, int] = {}
            for j in range(n):
                o = o_l[j]
                if o == 1:
                    q = live.pop(m_l[j], None)
                    if q is None:
                        stat[j] = 3
                        continue
                    p = q.ptr
                    if observed is not None:
                        observed.current = base + j
                    t0 = clock()
                    del q  # the pool takes the chunk back when its last reference goes
                    t1 = clock()
                elif o == 0 or o == 4:
                    if observed is not None:
                        observed.current = base + j
                    if multi and st_l[j] != cur:
                        cur = st_l[j]
                        objs[cur].use()
                    t0 = clock()
                    try:
                        live[base + j] = pool_malloc(s_l[j])
                    except errs as e:
                        t1l[j], t0l[j], stat[j] = clock(), t0, 2
                        dfree[j] = meminfo()[0]
                        if lp.note_oom(base + j, e, dfree[j], backend.stats()):
                            lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                            return
                        continue
                    t1 = clock()
                    p = live[base + j].ptr
                else:
                    continue
                addr[j] = p
                t0l[j] = t0
                t1l[j] = t1
                k -= 1
                if k == 0:
                    k = every
                    dfree[j] = meminfo()[0]
                    if lp.pending.signum:
                        lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                        lp.pending.check()
            lp.flush(base, addr, t0l, t1l, stat, dfree)
    finally:
        if multi:
            cupy.cuda.Stream.null.use()


def replay_on_device(trace: Trace, cfg: DeviceConfig) -> DeviceRun:
    """Replay ``trace`` on ``cfg.device``; everything taken is released before returning or raising."""
    cupy = _import_cupy()
    rt = cupy.cuda.runtime
    ev = trace.events
    ops = ev.op.astype(np.int64)
    sizes, mates = ev.size.astype(np.int64), trace.mate.astype(np.int64)
    _check_device(rt, cfg.device)
    with cupy.cuda.Device(cfg.device), deferred_signals() as pending:
        free_start, total = (int(x) for x in rt.memGetInfo())
        plan = plan_capacity(cfg.allocator, cfg.capacity, free_start, total)
        log = SegmentLog()
        lp = _Loop(len(ev), cfg, pending)
        ballast = Ballast(plan.ballast)
        backend: ObservedPool | AsyncPool | None = None
        try:
            if cfg.allocator is Allocator.CUPY:
                backend = ObservedPool(log, plan.pool_limit)
            elif cfg.allocator is Allocator.CUPY_ASYNC:
                backend = AsyncPool(cfg.device)
            free_replay = int(rt.memGetInfo()[0])
            t_start = time.perf_counter_ns()
            if backend is None:
                _loop_cuda(lp, ops, sizes, mates)
            else:
                _loop_pool(lp, ops, sizes, mates, ev.stream, backend)
            peak = _peak_reserved(cfg.allocator, backend, lp, free_replay)
        finally:
            _release(rt, lp, backend)
            ballast.release()
        free_end = int(rt.memGetInfo()[0])
    lp.t_end[lp.t_end > 0] -= t_start
    if len(log):
        log.t_end[:] = [t - t_start for t in log.t_end]
    return DeviceRun(cfg, plan, lp.status, lp.addr, lp.latency, lp.t_end, lp.device_free, log, total,
                     free_start, free_replay, free_end, peak, lp.ooms, lp.first_oom, lp.oom_state)


def _peak_reserved(alloc: Allocator, backend: Any, lp: _Loop, free_replay: int) -> int | None:
    """cupy: exact from the segment rows; cupy-async: the pool's high-water mark; cuda: sampled."""
    if isinstance(backend, ObservedPool):
        return backend.peak_reserved
    if isinstance(backend, AsyncPool):
        return backend.peak_reserved
    sampled = lp.device_free[lp.device_free >= 0]
    return int(free_replay - sampled.min()) if len(sampled) else 0


def _release(rt: Any, lp: _Loop, backend: ObservedPool | AsyncPool | None) -> None:
    """Give back every live block and all pool memory; device memory returns to its start value."""
    if backend is None:
        ptrs = list(lp.live.values())
        lp.live.clear()
        for p in ptrs:
            rt.free(p)
    else:
        if isinstance(backend, ObservedPool):
            backend.recording = False
        lp.live.clear()
        backend.release()
    rt.deviceSynchronize()


def _import_cupy() -> Any:
    try:
        import cupy
    except Exception as e:
        raise DeviceError(f"device replay needs CuPy and a GPU ({type(e).__name__}: {e})") from None
    return cupy


def _check_device(rt: Any, device: int) -> None:
    try:
        n = rt.getDeviceCount()
    except Exception as e:
        raise DeviceError(f"no CUDA device is usable ({e})") from None
    if not 0 <= device < n:
        raise DeviceError(f"--device {device} does not exist (this machine has {n} CUDA device(s))")
