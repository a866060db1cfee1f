"""The three real allocators a replay drives, set up so their device traffic can be observed.

- ``cuda``: ``cupy.cuda.runtime.malloc/free``, i.e. cudaMalloc/cudaFree per request.
- ``cupy``: a *fresh* ``MemoryPool`` (not the process's default one) over a
  ``PythonFunctionAllocator``, so every device allocation and release the pool
  makes (misses, ``free_all_blocks`` during its OOM retry) passes through
  ``_dev_malloc``/``_dev_free`` and becomes a ``segment_alloc``/``segment_free``
  row with its own latency and a ``cudaMemGetInfo`` sample.
- ``cupy-async``: ``MemoryAsyncPool`` on the device's current memory pool
  (stream-ordered cudaMallocAsync); its reservation is read from the pool's
  ``ReservedMemHigh`` attribute because no callback reports it.

``SegmentLog`` collects emitted rows as plain int lists (rows are per device
allocation, far fewer than events).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from tracekit.trace.schema import Op

# cudaMemPoolAttr values (driver_types.h)
_ATTR_RESERVED_CURRENT = 5
_ATTR_RESERVED_HIGH = 6


@dataclass
class SegmentLog:
    """Rows the allocator emitted: inserted before input index ``before`` (n = at the end)."""

    before: list[int] = field(default_factory=list)
    op: list[int] = field(default_factory=list)
    addr: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    latency: list[int] = field(default_factory=list)
    t_end: list[int] = field(default_factory=list)
    device_free: list[int] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)  # per row when the allocator says (torch), else empty

    def add(self, before: int, op: Op, addr: int, size: int, lat: int, t_end: int, dfree: int) -> None:
        self.before.append(before)
        self.op.append(int(op))
        self.addr.append(addr)
        self.size.append(size)
        self.latency.append(lat)
        self.t_end.append(t_end)
        self.device_free.append(dfree)

    def __len__(self) -> int:
        return len(self.before)


class Upstream:
    """The device allocations a pool under replay makes: counted (bytes reserved and their peak) and
    logged as segment rows with their latency (ns) and the device's free memory after each.

    ``current`` must be set by the replay loop to the input index being replayed, so rows land
    before it; ``recording`` is switched off for the final cleanup, which is not part of the
    replayed trace.
    """

    def __init__(self, log: SegmentLog) -> None:
        from cupy.cuda import runtime

        self._rt = runtime
        self.log = log
        self.current = 0
        self.recording = True
        self.reserved = 0
        self.peak_reserved = 0

    def took(self, ptr: int, size: int, t0: int, t1: int) -> None:
        """The pool took ``size`` bytes at ``ptr`` from the device between ``t0`` and ``t1`` (ns)."""
        self.reserved += size
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        if self.recording:
            self.log.add(self.current, Op.SEGMENT_ALLOC, ptr, size, t1 - t0, t1, self._rt.memGetInfo()[0])

    def gave(self, ptr: int, size: int, t0: int, t1: int) -> None:
        """The pool gave the ``size`` bytes at ``ptr`` back between ``t0`` and ``t1`` (ns)."""
        self.reserved -= size
        if self.recording:
            self.log.add(self.current, Op.SEGMENT_FREE, ptr, size, t1 - t0, t1, self._rt.memGetInfo()[0])


class ObservedPool(Upstream):
    """A fresh CuPy MemoryPool whose device allocations/releases are logged as segment rows."""

    def __init__(self, log: SegmentLog, pool_limit: int | None) -> None:
        from cupy.cuda import memory

        super().__init__(log)
        self._seg: dict[int, int] = {}
        alloc = memory.PythonFunctionAllocator(self._dev_malloc, self._dev_free)
        self.pool = memory.MemoryPool(alloc.malloc)
        if pool_limit is not None:
            self.pool.set_limit(size=pool_limit)

    def _dev_malloc(self, size: int, device_id: int) -> int:
        t0 = time.perf_counter_ns()
        ptr = self._rt.malloc(size)  # raises cudaErrorMemoryAllocation, which the pool retries on
        self._seg[ptr] = size
        self.took(ptr, size, t0, time.perf_counter_ns())
        return ptr

    def _dev_free(self, ptr: int, device_id: int) -> None:
        t0 = time.perf_counter_ns()
        self._rt.free(ptr)
        self.gave(ptr, self._seg.pop(ptr, 0), t0, time.perf_counter_ns())

    def stats(self) -> dict[str, int]:
        p = self.pool
        return {"live_bytes": int(p.used_bytes()), "reserved_bytes": int(p.total_bytes()),
                "free_bytes": int(p.free_bytes())}

    def release(self) -> None:
        self.recording = False
        self.pool.free_all_blocks()


class AsyncPool:
    """CuPy's MemoryAsyncPool on the device's current cudaMemPool, with its high-water mark reset."""

    def __init__(self, device: int) -> None:
        from cupy.cuda import memory, runtime

        self._rt = runtime
        self.pool = memory.MemoryAsyncPool()
        self._handle: int | None
        try:
            self._handle = int(runtime.deviceGetMemPool(device))
            runtime.memPoolSetAttribute(self._handle, _ATTR_RESERVED_HIGH, 0)
        except Exception:  # very old drivers: no high-water mark, peak reported as unknown
            self._handle = None
        self._base = self._attr(_ATTR_RESERVED_CURRENT) or 0

    def _attr(self, attr: int) -> int | None:
        if self._handle is None:
            return None
        try:
            return int(self._rt.memPoolGetAttribute(self._handle, attr))
        except Exception:
            return None

    @property
    def peak_reserved(self) -> int | None:
        high = self._attr(_ATTR_RESERVED_HIGH)
        return None if high is None else max(0, high - self._base)

    def stats(self) -> dict[str, Any]:
        p = self.pool
        return {"live_bytes": int(p.used_bytes()), "reserved_bytes": int(p.total_bytes()),
                "free_bytes": int(p.total_bytes()) - int(p.used_bytes())}

    def release(self) -> None:
        self._rt.deviceSynchronize()
        self.pool.free_all_blocks()  # synchronize + cudaMemPoolTrimTo(pool, 0)
