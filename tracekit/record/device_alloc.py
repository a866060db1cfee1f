"""Segment rows: the pool's own device allocations, seen by putting it on an allocator we own.

CuPy fires no hook when its pool gives memory back to the device
(``free_all_blocks``, the retry sequence before an out-of-memory error), so
``install_pool`` builds a fresh ``MemoryPool`` over a
``PythonFunctionAllocator`` whose functions call ``cudaMalloc``/``cudaFree``
exactly as CuPy's default allocator does and log a ``segment_alloc`` or
``segment_free`` row. The new pool becomes CuPy's default pool, so the
program's own ``cupy.get_default_memory_pool()`` (``set_limit``,
``free_all_blocks``, ``used_bytes``) acts on the recorded pool. A failed
``cudaMalloc`` raises the same ``CUDARuntimeError`` it always does, so the
pool's retry-and-release logic is unchanged; failures are only counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tracekit.record.hook import DEVICE_SHIFT, SEGMENT_ALLOC, SEGMENT_FREE, EventBuffer


class SegmentLog:
    """``malloc(size, device_id)`` / ``free(ptr, device_id)`` for PythonFunctionAllocator, logging rows."""

    def __init__(
        self,
        buffer: EventBuffer,
        *,
        device_malloc: Callable[[int], int],
        device_free: Callable[[int], None],
        current_stream: Callable[[], Any],
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._ext = buffer.extend
        self._malloc = device_malloc
        self._free = device_free
        self._stream = current_stream
        self._clock = clock
        self.sizes: dict[tuple[int, int], int] = {}  # (device, ptr) -> bytes of live segments
        self.failures = 0  # cudaMalloc calls that raised (the pool retries or raises OOM)
        self.devices: set[int] = set()
        self.active = True  # False after the recording ends: frees at exit only release memory


    def malloc(self, size: int, device_id: int) -> int:
        try:
            ptr = self._malloc(size)
        except Exception:
            self.failures += 1
            raise
        self.sizes[(device_id, ptr)] = size
        self.devices.add(device_id)
        self._ext((self._clock(), (device_id << DEVICE_SHIFT) | SEGMENT_ALLOC, ptr, size, 0,
                   self._stream().ptr))
        return ptr

    def free(self, ptr: int, device_id: int) -> None:
        if not self.active:
            self._free(ptr)
            return
        size = self.sizes.pop((device_id, ptr), 0)
        self._free(ptr)
        self._ext((self._clock(), (device_id << DEVICE_SHIFT) | SEGMENT_FREE, ptr, size, 0,
                   self._stream().ptr))

    def live_bytes(self, device_id: int) -> int:
        return sum(s for (d, _), s in self.sizes.items() if d == device_id)


def install_pool(cupy: Any, log: SegmentLog, limit: int | None) -> tuple[Any, Any]:
    """Make a recorded MemoryPool CuPy's default pool; return (new pool, previous pool)."""
    allocator = cupy.cuda.PythonFunctionAllocator(log.malloc, log.free)
    pool = cupy.cuda.MemoryPool(allocator.malloc)
    previous = cupy.get_default_memory_pool()
    cupy._default_memory_pool = pool  # what cupy.get_default_memory_pool() returns
    cupy.cuda.set_allocator(pool.malloc)
    if limit:
        pool.set_limit(size=limit)
    return pool, previous


def restore_pool(cupy: Any, previous: Any) -> None:
    """Put the pool that was the default before ``install_pool`` back."""
    cupy._default_memory_pool = previous
    cupy.cuda.set_allocator(previous.malloc)


def pool_state(pool: Any) -> dict[str, int]:
    """The pool's own counters for the current device (bytes; 512-rounded, see cupy-pool docs)."""
    return {
        "used_bytes": int(pool.used_bytes()),
        "total_bytes": int(pool.total_bytes()),
        "free_bytes": int(pool.free_bytes()),
        "n_free_blocks": int(pool.n_free_blocks()),
        "limit": int(pool.get_limit()),
    }
