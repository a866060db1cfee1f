"""Segment rows: each pool's own device allocations, seen through the allocator the pool is built on.

CuPy fires no hook when a pool gives memory back to the device
(``free_all_blocks``, the retry sequence before an out-of-memory error), so
every ``MemoryPool`` made while recording without an allocator of its own
runs over a ``PythonFunctionAllocator`` whose functions get device memory
exactly as CuPy's ``_malloc`` would (``cudaMalloc``/``cudaFree``) and log a
``segment_alloc`` or ``segment_free`` row carrying the pool's id (taken when
the segment is made) and ``cudaMemGetInfo``'s free bytes measured right after
(device-level events are rare, so the measurement costs nothing per malloc).
A failed allocation raises the same error it always does, so the pool's
retry-and-release logic is unchanged; failures are only counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tracekit.record.hook import SEGMENT_ALLOC, SEGMENT_FREE, UNMEASURED, EventBuffer, code_of


class SegmentLog:
    """``malloc(size, device_id)`` / ``free(ptr, device_id)`` for PythonFunctionAllocator, logging rows.

    ``device_malloc(size)`` returns ``(ptr, keep)``: ``keep`` is what must stay
    alive until the free (a user allocator's MemoryPointer; None for raw
    cudaMalloc); ``device_free(ptr, keep)`` releases it. ``pool_id(device)``
    gives the trace's pool id; ``free_bytes(device)`` measures the device.
    """

    def __init__(
        self,
        buffer: EventBuffer,
        *,
        device_malloc: Callable[[int], tuple[int, Any]],
        device_free: Callable[[int, Any], None],
        current_stream: Callable[[], Any],
        pool_id: Callable[[int], int] = lambda device: 0,
        free_bytes: Callable[[int], int] = lambda device: UNMEASURED,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._ext = buffer.extend
        self._malloc = device_malloc
        self._free = device_free
        self._stream = current_stream
        self._pool_id = pool_id
        self._free_bytes = free_bytes
        self._clock = clock
        self.live: dict[tuple[int, int], tuple[int, Any, int]] = {}  # (device, ptr) -> (bytes, keep, pool)
        self.failures = 0  # allocations that raised (the pool retries or raises OOM)
        self.devices: set[int] = set()
        self.active = True  # False after the recording ends: frees then only release memory

    def malloc(self, size: int, device_id: int) -> int:
        try:
            ptr, keep = self._malloc(size)
        except Exception:
            self.failures += 1
            raise
        if not self.active:
            self.live[(device_id, ptr)] = (size, keep, -1)
            return ptr
        pool = self._pool_id(device_id)
        self.live[(device_id, ptr)] = (size, keep, pool)
        self.devices.add(device_id)
        free = self._measure(device_id)
        self._ext((self._clock(), code_of(SEGMENT_ALLOC, device_id, pool), ptr, size, 0,
                   self._stream().ptr, free, -1))
        return ptr

    def free(self, ptr: int, device_id: int) -> None:
        size, keep, pool = self.live.pop((device_id, ptr), (0, None, -1))
        self._free(ptr, keep)
        if not self.active or pool < 0:
            return
        free = self._measure(device_id)
        self._ext((self._clock(), code_of(SEGMENT_FREE, device_id, pool), ptr, size, 0,
                   self._stream().ptr, free, -1))

    def _measure(self, device_id: int) -> int:
        try:
            return int(self._free_bytes(device_id))
        except Exception:  # a device that cannot answer now: the row keeps "not measured"
            return UNMEASURED

    def live_bytes(self, device_id: int) -> int:
        return sum(s for (d, _), (s, _k, _p) in self.live.items() if d == device_id)


def raw_device_alloc(rt: Any) -> tuple[Callable[[int], tuple[int, Any]], Callable[[int, Any], None]]:
    """cudaMalloc/cudaFree as CuPy's default allocator calls them (``_malloc`` -> ``Memory``)."""
    return (lambda size: (int(rt.malloc(size)), None)), (lambda ptr, keep: rt.free(ptr))


def pool_state(pool: Any) -> dict[str, int | None]:
    """A MemoryPool's own counters for the current device (bytes; 512-rounded, see cupy-pool docs)."""
    return {
        "used_bytes": int(pool.used_bytes()),
        "total_bytes": int(pool.total_bytes()),
        "free_bytes": int(pool.free_bytes()),
        "n_free_blocks": int(pool.n_free_blocks()),
        "limit_bytes": int(pool.get_limit()) or None,
    }


def async_pool_state(pool: Any) -> dict[str, int | None]:
    """A MemoryAsyncPool's counters for the current device (driver mempool attributes)."""
    out: dict[str, int | None] = {"used_bytes": None, "total_bytes": None, "limit_bytes": None}
    for key, fn in (("used_bytes", pool.used_bytes), ("total_bytes", pool.total_bytes),
                    ("limit_bytes", pool.get_limit)):
        try:
            out[key] = int(fn())
        except Exception:  # an old driver without mempool statistics
            out[key] = None
    if out["limit_bytes"] is not None and out["limit_bytes"] >= 2**63:
        out["limit_bytes"] = None  # UINT64_MAX: no limit
    return out
