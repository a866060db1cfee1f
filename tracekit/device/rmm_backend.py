"""``replay --device N --allocator rmm-pool``: the requests through RMM's real ``PoolMemoryResource``.

The pool is a fresh ``rmm.mr.PoolMemoryResource`` (the process's current resource is left as it
is) over a ``CallbackMemoryResource`` that passes each upstream request to a
``CudaMemoryResource``, so every block the pool takes from the device is a ``segment_alloc`` row
with its latency and a ``cudaMemGetInfo`` sample, as ``ObservedPool`` does for CuPy's pool. The
capacity is the pool's ``maximum_pool_size`` (aligned down to RMM's 256 bytes); the initial pool is
what the ``rmm-pool`` model starts with (``sim.policies.rmm_pool.initial_pool_size``: half the
recorded free memory, else 0, never above the maximum), so a ``--compare-sim rmm-pool`` compares
the same pool. A request is an ``rmm.DeviceBuffer`` on the pool and the request's stream; its free
is dropping the buffer (RMM gives the block back then). RMM signals a refused request with
``MemoryError``. At the end the buffers are dropped and the pool deleted, which gives its upstream
blocks back (not recorded: not part of the replayed trace). Managed memory is never used.
"""

from __future__ import annotations

import time
from typing import Any

from tracekit.device.allocators import SegmentLog, Upstream
from tracekit.errors import DeviceError

ALIGNMENT = 256  # rmm::CUDA_ALLOCATION_ALIGNMENT; RMM refuses a maximum pool size not a multiple of it


def import_rmm() -> Any:
    """The ``rmm`` package, or a DeviceError in one sentence saying how to get it."""
    try:
        import rmm
    except Exception as e:  # ImportError, or a CUDA library RMM's wheel cannot load
        raise DeviceError("--allocator rmm-pool needs RMM (pip install rmm-cu12 or rmm-cu13), which cannot "
                          f"be imported ({type(e).__name__}: {e})") from None
    return rmm


class _Requests:
    """``malloc(size)`` on the pool and the current request's stream, as ``loop_pool`` calls it."""

    def __init__(self, rmm: Any, mr: Any) -> None:
        self._buffer, self._mr = rmm.DeviceBuffer, mr
        self.stream: Any = None  # rmm Stream of the request being replayed (None: the default stream)

    def drop(self) -> None:
        """Forget the pool (and the stream): ``malloc`` cannot be called after this."""
        self._mr = self.stream = None

    def malloc(self, size: int) -> Any:
        if self.stream is None:
            return self._buffer(size=size, mr=self._mr)
        return self._buffer(size=size, stream=self.stream, mr=self._mr)


class RmmPool(Upstream):
    """A fresh RMM pool whose upstream blocks are logged as segment rows."""

    def __init__(self, log: SegmentLog, maximum: int | None, initial: int) -> None:
        rmm = import_rmm()
        super().__init__(log)
        self._cuda = rmm.mr.CudaMemoryResource()
        self._upstream = rmm.mr.CallbackMemoryResource(self._dev_malloc, self._dev_free)
        top = None if maximum is None else maximum // ALIGNMENT * ALIGNMENT
        self._mr = rmm.mr.PoolMemoryResource(self._upstream, initial_pool_size=initial,
                                             maximum_pool_size=top)
        self.pool = _Requests(rmm, self._mr)
        self._streams: dict[int, Any] = {}
        self._stream_type = rmm.pylibrmm.stream.Stream

    def use_stream(self, cupy_stream: Any) -> None:
        """Requests from now on go to ``cupy_stream``'s stream (the null stream: RMM's default)."""
        ptr = int(cupy_stream.ptr)
        if ptr == 0:
            self.pool.stream = None
            return
        if ptr not in self._streams:
            self._streams[ptr] = self._stream_type(cupy_stream)
        self.pool.stream = self._streams[ptr]

    def _dev_malloc(self, size: int, stream: Any) -> int:
        t0 = time.perf_counter_ns()
        ptr = int(self._cuda.allocate(size, stream))  # MemoryError when the device refuses: RMM halves
        self.took(ptr, size, t0, time.perf_counter_ns())
        return ptr

    def _dev_free(self, ptr: int, size: int, stream: Any) -> None:
        t0 = time.perf_counter_ns()
        self._cuda.deallocate(ptr, size, stream)
        self.gave(ptr, size, t0, time.perf_counter_ns())

    def stats(self) -> dict[str, int]:
        return {"reserved_bytes": int(self._mr.pool_size())}

    def release(self) -> None:
        """Delete the pool (the live buffers were dropped before): its upstream blocks go back."""
        import gc

        self.recording = False
        # Emptied, not replaced: a replay loop that raised still holds the object's bound malloc in
        # its traceback, and through it the pool would stay alive.
        self.pool.drop()
        del self._mr
        gc.collect()
        self._rt.deviceSynchronize()
        if self.reserved:
            raise DeviceError(f"RMM's pool kept {self.reserved} bytes of device memory after it was deleted")
