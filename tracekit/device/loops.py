"""The timed replay loops, one per kind of allocator, and the state they fill.

``loop_cuda`` calls cudaMalloc/cudaFree directly; ``loop_pool`` calls a pool's
``malloc`` and frees by dropping the last reference to the returned
``MemoryPointer`` (CuPy's pools take a block back at that moment). Both work
in chunks of ``CHUNK`` events turned into Python lists: per event the work is
list indexing, one dict operation, two ``perf_counter_ns`` reads and three list
stores around the call, and no Python object outlives its chunk. Every
``Loop.every`` requests they sample cudaMemGetInfo and look for a pending
Ctrl-C/SIGTERM, raising it there, where the map of live blocks is complete.

Requests the program survived (handled ``oom`` rows, ``Loop.attempts``) are replayed as
the program made them: a failure is counted and the replay goes on; a request the device
can serve stands in for the retry that replaced it (that ``malloc`` makes no call and its
free releases the attempt's block), or is released at once where nothing replaced it.
Only the fatal request (or, with ``stop_at_first_oom``, any) stops the replay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.device.allocators import AsyncPool, ObservedPool, Upstream
from tracekit.device.rmm_backend import RmmPool
from tracekit.errors import DeviceError
from tracekit.interrupts import Held
from tracekit.sim.base import Status
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

CHUNK = 1 << 16
_CUDA_OOM = 2  # cudaErrorMemoryAllocation (cudaError_t)


class Loop:
    """Mutable state shared by the loops: output arrays, live blocks, OOM bookkeeping."""

    def __init__(self, n: int, continue_on_oom: bool, sample_every: int | None,
                 pending: Held, attempts: Attempts | None = None) -> None:
        self.continue_on_oom = continue_on_oom
        self.handled = attempts.handled if attempts is not None else np.zeros(n, np.bool_)
        # per row where any row is handled, else empty (``ReplayInput.replaced_by``): read at handled rows
        self.replaced_by = attempts.replaced_by if attempts is not None else np.zeros(0, np.int64)
        self.standing: dict[int, Any] = {}  # retry row -> the served attempt's block standing in for it
        self.released = np.zeros(n, np.bool_)  # handled attempts served and released at once
        self.handled_ooms = 0
        self.pending = pending
        self.every = sample_every or sampling_interval(n)
        self.k = self.every  # requests left until the next sample (loops that resume keep it here)
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
        if type(err).__module__.startswith("cupy"):  # PyTorch raises only its OutOfMemoryError here
            from cupy.cuda import runtime

            if isinstance(err, runtime.CUDARuntimeError) and err.status != _CUDA_OOM:
                raise DeviceError(f"CUDA error at event {i}: {err}") from None
        if self.handled[i]:  # the program survived this failure: the replay goes on, as it did
            self.handled_ooms += 1
            return False
        self.ooms += 1
        if self.first_oom < 0:
            self.first_oom = i
            self.oom_state = {"device_free": free, "error": str(err), **(stats or {})}
        return not self.continue_on_oom


    def skip(self, i: int) -> bool:
        """Row i is a handled attempt whose retry an earlier, served attempt already stands in for
        (the program would not have made it): no call, status ``TRIED``."""
        if not self.handled[i]:
            return False
        r = int(self.replaced_by[i])  # given for every row where any row is handled
        return r >= 0 and r in self.standing

    def served(self, i: int) -> Any:
        """Handled attempt i was served (its block is ``live[i]``): it stands in for its retry,
        or, with nothing to stand in for, is returned for the caller to release at once (else None)."""
        r = int(self.replaced_by[i])
        if r >= 0:  # the block moves to its retry: only the retry's free may release it
            self.standing[r] = self.live.pop(i)
            return None
        self.released[i] = True
        return self.live.pop(i)


@dataclass(frozen=True)
class Attempts:
    """Per input row: ``handled`` (an ``oom`` row the program survived) and ``replaced_by``
    (the ``malloc`` that replaced it, -1 none), as ``tracekit.sim.prepare`` finds them; with
    ``stop_at_first_oom`` no row is handled and the first failure stops the replay."""

    handled: np.ndarray
    replaced_by: np.ndarray

    @classmethod
    def of(cls, trace: Trace, stop_at_first_oom: bool) -> Attempts:
        from tracekit.sim.codes import Kind
        from tracekit.sim.prepare import prepare

        inp = prepare(trace)
        n = len(inp)
        if stop_at_first_oom:
            return cls(np.zeros(n, np.bool_), np.full(n, -1, np.int64))
        return cls(inp.kind == Kind.TRY, inp.replaced_by)


def sampling_interval(n: int) -> int:
    """Requests between two cudaMemGetInfo samples: n // 1000 clamped to [1, 1000]."""
    return max(1, min(1000, n // 1000))


def _chunks(n: int) -> range:
    return range(0, n, CHUNK)


def loop_cuda(lp: Loop, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray, rt: Any = None) -> None:
    """cudaMalloc/cudaFree per request; the hot loop is kept to list indexing and two clock reads.

    ``rt`` is ``cupy.cuda.runtime`` unless given. A failed cudaFree is a DeviceError.
    """
    if rt is None:
        from cupy.cuda import runtime

        rt = runtime

    malloc, free, meminfo, clock, err_t = rt.malloc, rt.free, rt.memGetInfo, time.perf_counter_ns, \
        rt.CUDARuntimeError
    live, every, standing, handled = lp.live, lp.every, lp.standing, lp.handled
    # plain ints in locals: an IntEnum compare or attribute load per event would slow the loop
    FREE, MALLOC, OOM = int(Op.FREE), int(Op.MALLOC), int(Op.OOM)
    S_OOM, S_SKIPPED, S_TRIED = int(Status.OOM), int(Status.SKIPPED), int(Status.TRIED)
    k = every
    for base in _chunks(len(ops)):
        o_arr = ops[base:base + CHUNK]
        o_l, s_l, m_l = o_arr.tolist(), sizes[base:base + CHUNK].tolist(), mates[base:base + CHUNK].tolist()
        n = len(o_l)
        addr, t0l, t1l = [0] * n, [0] * n, [0] * n
        stat = default_status(o_arr)
        dfree: dict[int, int] = {}
        for j in range(n):
            o = o_l[j]
            if o == FREE:
                p = live.pop(m_l[j], None)
                if p is None:
                    stat[j] = S_SKIPPED  # its malloc failed (--continue-on-oom)
                    continue
                t0 = clock()
                try:
                    free(p)
                except err_t as e:
                    lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j)
                    raise DeviceError(f"CUDA error at event {base + j} (cudaFree): {e}") from None
                t1 = clock()
            elif o == MALLOC or o == OOM:  # noqa: SIM109 - a tuple per event is slower
                if standing and base + j in standing:  # a served attempt's block stands in for it
                    live[base + j] = addr[j] = standing.pop(base + j)
                    stat[j] = S_TRIED
                    continue
                if o == OOM and lp.skip(base + j):
                    stat[j] = S_TRIED
                    continue
                t0 = clock()
                try:
                    p = malloc(s_l[j])
                except err_t as e:
                    t1l[j], t0l[j], stat[j] = clock(), t0, S_OOM
                    dfree[j] = meminfo()[0]
                    if lp.note_oom(base + j, e, dfree[j], None):
                        lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                        return
                    continue
                t1 = clock()
                live[base + j] = p
                if o == OOM and handled[base + j] and lp.served(base + j) is not None:
                    free(p)  # nothing replaced it: released at once
                    stat[j] = S_TRIED
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


def default_status(o_arr: np.ndarray) -> list:
    """DONE for requests (malloc, free, oom), IGNORED for the input's own segment rows."""
    return ((o_arr == Op.MALLOC) | (o_arr == Op.FREE) | (o_arr == Op.OOM)).astype(np.int8).tolist()


def replay_streams(ops: np.ndarray, streams: np.ndarray) -> dict[int, Any]:
    """One CuPy stream per recorded stream that allocates (the null stream for 0).

    Made before the replay measures free memory: the driver takes device memory for new
    streams (about 0.5 MiB each on an H200, kept for reuse after they are destroyed), which
    must not come out of the replayed capacity.
    """
    import cupy

    uniq = np.unique(streams[(ops == Op.MALLOC) | (ops == Op.OOM)])
    return {int(s): (cupy.cuda.Stream.null if s == 0 else cupy.cuda.Stream()) for s in uniq}


def loop_pool(lp: Loop, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray, streams: np.ndarray,
              backend: ObservedPool | AsyncPool | RmmPool, objs: dict[int, Any]) -> None:
    """Pool malloc per request on its stream (``objs``: ``replay_streams``; RMM is told the stream
    itself, CuPy's pools take the current one); a free is dropping the last reference to its
    MemoryPointer (or ``rmm.DeviceBuffer``)."""
    import cupy
    from cupy.cuda import memory
    from cupy.cuda import runtime as rt

    meminfo, clock = rt.memGetInfo, time.perf_counter_ns
    pool_malloc = backend.pool.malloc
    observed = backend if isinstance(backend, Upstream) else None
    rmm_pool = backend if isinstance(backend, RmmPool) else None
    errs: tuple[type[BaseException], ...] = (memory.OutOfMemoryError, rt.CUDARuntimeError)
    if rmm_pool is not None:
        errs = (*errs, MemoryError)  # RMM refuses a request with MemoryError
    live, every, standing, handled = lp.live, lp.every, lp.standing, lp.handled
    FREE, MALLOC, OOM = int(Op.FREE), int(Op.MALLOC), int(Op.OOM)
    S_OOM, S_SKIPPED, S_TRIED = int(Status.OOM), int(Status.SKIPPED), int(Status.TRIED)
    k = every
    multi = len(objs) > 1
    cur = -1
    try:
        for base in _chunks(len(ops)):
            o_arr = ops[base:base + CHUNK]
            o_l, s_l, m_l, st_l = (a[base:base + CHUNK].tolist() for a in (ops, sizes, mates, streams))
            n = len(o_l)
            addr, t0l, t1l = [0] * n, [0] * n, [0] * n
            stat = default_status(o_arr)
            dfree: dict[int, int] = {}
            for j in range(n):
                o = o_l[j]
                if o == FREE:
                    q = live.pop(m_l[j], None)
                    if q is None:
                        stat[j] = S_SKIPPED
                        continue
                    p = q.ptr
                    if observed is not None:
                        observed.current = base + j
                    t0 = clock()
                    del q  # the pool takes the chunk back when its last reference goes
                    t1 = clock()
                elif o == MALLOC or o == OOM:  # noqa: SIM109 - a tuple per event is slower
                    if standing and base + j in standing:  # a served attempt's block stands in for it
                        live[base + j] = standing.pop(base + j)
                        addr[j], stat[j] = live[base + j].ptr, S_TRIED
                        continue
                    if o == OOM and lp.skip(base + j):
                        stat[j] = S_TRIED
                        continue
                    if observed is not None:
                        observed.current = base + j
                    if multi and st_l[j] != cur:
                        cur = st_l[j]
                        if rmm_pool is not None:
                            rmm_pool.use_stream(objs[cur])
                        else:
                            objs[cur].use()
                    t0 = clock()
                    try:
                        live[base + j] = pool_malloc(s_l[j])
                    except errs as e:
                        t1l[j], t0l[j], stat[j] = clock(), t0, S_OOM
                        dfree[j] = meminfo()[0]
                        if lp.note_oom(base + j, e, dfree[j], backend.stats()):
                            lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                            return
                        continue
                    t1 = clock()
                    p = live[base + j].ptr
                    if o == OOM and handled[base + j] and lp.served(base + j) is not None:
                        stat[j] = S_TRIED  # nothing replaced it: released at once (dropped here)
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
