"""Segment rows: each pool's own device allocations, seen through CuPy's memory hook.

Nothing of CuPy's is replaced while recording (``tracekit.record.pools``), so the recorder sees a
pool's device allocations where CuPy shows them: the hook's ``alloc_preprocess`` and
``alloc_postprocess``, around every ``cudaMalloc`` a ``SingleDeviceMemoryPool`` makes
(cupy/cuda/memory.pyx, 14.2, ``_alloc``), each logged as a ``segment_alloc`` row with the pool's
id (the pool behind the allocator installed in the thread) and ``cudaMemGetInfo``'s free bytes
measured right after. CuPy fires no hook when a pool gives memory back (``free_all_blocks``, the
retry before an out-of-memory error, a pool that dies), so a segment's end is found by asking:

- before every device allocation (``alloc_preprocess``), the pool behind the installed allocator
  is asked its ``total_bytes()`` (CuPy has already counted the new request in it): where it holds
  less than the live segments the recorder knows of, those segments' pointers are probed
  (``cudaPointerGetAttributes``: a freed pointer is no longer device memory) and the freed ones
  get their ``segment_free`` rows, before the new segment's row;
- before an out-of-memory row, at every spool write (``interval``, 0.5 s) and when the recording
  ends, every live segment of a pool whose total differs (or that the recorder cannot reach) is
  probed the same way.

So the rows keep the order that matters: a pool's peak (a device allocation) and every
out-of-memory error come after the frees CuPy made before them. A ``free_all_blocks()`` that the
program calls itself is dated at the next device allocation, out-of-memory error or spool write,
whichever comes first (at most the spool interval later): between the two only blocks inside the
surviving segments are taken and given back. A failed device allocation raises the same error it
always does; failures are only counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tracekit.record.hook import SEGMENT_ALLOC, SEGMENT_FREE, UNMEASURED, EventBuffer, code_of

# (pool id, the pool object or None) of the allocator installed in this thread, for ``device``
PoolOf = Callable[[int], tuple[int, Any]]


class HookedSegments:
    """The live segments of every pool (from the hook's alloc callbacks) and their ends (probed).

    ``pool_of(device)`` names the pool a device allocation made now belongs to; ``alive(ptr)``
    says whether a pointer is still device memory; ``free_bytes(device)`` measures the device;
    ``total_of(pool, device)`` is the pool's own ``total_bytes()`` on that device.
    """

    def __init__(
        self,
        buffer: EventBuffer,
        *,
        pool_of: PoolOf,
        alive: Callable[[int], bool],
        total_of: Callable[[Any, int], int],
        current_stream: Callable[[], Any],
        free_bytes: Callable[[int], int] = lambda device: UNMEASURED,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._ext = buffer.extend
        self._pool_of, self._alive, self._total_of = pool_of, alive, total_of
        self._stream = current_stream
        self._free_bytes = free_bytes
        self._clock = clock
        self.live: dict[tuple[int, int], tuple[int, int]] = {}  # (device, ptr) -> (bytes, pool id)
        self.held: dict[tuple[int, int], int] = {}  # (pool id, device) -> live segment bytes
        self.offset: dict[tuple[int, int], int] = {}  # (pool id, device) -> total - held once probed
        self.failures = 0  # device allocations that raised (the pool retries or raises OOM)
        self.probes = 0  # pointers probed (docs/record.md: the cost)
        self.devices: set[int] = set()
        self.active = True  # False after the recording ends

    # -- the hook's callbacks ------------------------------------------------------------------
    def before_alloc(self, device: int, size: int) -> None:
        """``alloc_preprocess``: end the installed pool's segments that CuPy freed since."""
        if not self.active:
            return
        pid, pool = self._pool_of(device)
        if pool is not None:
            self._reconcile(pid, pool, device, size)

    def after_alloc(self, device: int, size: int, ptr: int) -> None:
        """``alloc_postprocess``: a ``segment_alloc`` row (ptr 0: the allocation failed)."""
        if not ptr:
            self.failures += 1
            return
        if not self.active:
            return
        pid, _ = self._pool_of(device)
        stale = self.live.get((device, ptr))
        if stale is not None:  # the address is new again: the segment there ended unseen
            self._end(device, ptr)
        self.live[(device, ptr)] = (size, pid)
        self.held[(pid, device)] = self.held.get((pid, device), 0) + size
        self.devices.add(device)
        self._ext((self._clock(), code_of(SEGMENT_ALLOC, device, pid), ptr, size, 0,
                   self._stream().ptr, self._measure(device), -1))

    # -- finding the ends ----------------------------------------------------------------------
    def _reconcile(self, pid: int, pool: Any, device: int, extra: int = 0) -> None:
        """Probe ``pid``'s segments on ``device`` where the pool holds less than the recorder knows."""
        try:
            total = int(self._total_of(pool, device))
        except Exception:  # a pool or device that cannot answer now: the sweeps probe later
            return
        key = (pid, device)
        if total - extra - self.held.get(key, 0) == self.offset.get(key, 0):
            return
        self._probe([k for k, (_, p) in self.live.items() if p == pid and k[0] == device])
        # What the pool holds beyond what the hook showed (segments made before the recording, or
        # another pool's counted here): remembered, so an unchanged pool is not probed again.
        self.offset[key] = total - extra - self.held.get(key, 0)

    def sweep(self, pools: dict[int, tuple[Any, int]] | None = None) -> None:
        """Probe every live segment except those of the pools (pool id -> (pool, device)) whose
        totals show nothing freed: before an OOM row, at each spool write, at the end."""
        if not self.active or not self.live:
            return
        settled: set[tuple[int, int]] = set()
        for pid, (pool, device) in (pools or {}).items():
            key = (pid, device)
            try:
                total = int(self._total_of(pool, device))
            except Exception:
                continue
            if total - self.held.get(key, 0) == self.offset.get(key, 0):
                settled.add(key)
        self._probe([k for k, (_, p) in self.live.items() if (p, k[0]) not in settled])

    def _probe(self, keys: list[tuple[int, int]]) -> None:
        for device, ptr in keys:
            self.probes += 1
            try:
                gone = not self._alive(ptr)
            except Exception:  # the device cannot answer (a sticky error): nothing is concluded
                return
            if gone:
                self._end(device, ptr)

    def _end(self, device: int, ptr: int) -> None:
        size, pid = self.live.pop((device, ptr))
        self.held[(pid, device)] -= size
        self._ext((self._clock(), code_of(SEGMENT_FREE, device, pid), ptr, size, 0,
                   self._stream().ptr, self._measure(device), -1))

    def _measure(self, device_id: int) -> int:
        try:
            return int(self._free_bytes(device_id))
        except Exception:  # a device that cannot answer now: the row keeps "not measured"
            return UNMEASURED

    def live_bytes(self, device_id: int) -> int:
        return sum(s for (d, _), (s, _p) in self.live.items() if d == device_id)


def device_pointer(rt: Any) -> Callable[[int], bool]:
    """``alive(ptr)``: ``cudaPointerGetAttributes`` still calls ``ptr`` device memory (type 2);
    a freed pointer is unregistered (type 0) or refused."""

    def alive(ptr: int) -> bool:
        try:
            attrs = rt.pointerGetAttributes(ptr)
        except rt.CUDARuntimeError:
            return False
        return int(attrs.type) == 2 and int(attrs.devicePointer) == ptr

    return alive


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
