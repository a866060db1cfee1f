"""Every CuPy pool a recorded program makes: ids, allocators, and the async pool's own rows.

While recording, ``cupy.cuda.MemoryPool`` and ``cupy.cuda.MemoryAsyncPool``
(and their names in ``cupy.cuda.memory``) are subclasses made here, so every
pool the program creates, in any thread, is known (CuPy's pool classes are
Cython classes whose methods cannot be patched; their names can). A
``MemoryPool`` gets a ``SegmentLog`` allocator wrapping whatever allocator
the program passed, so its device allocations become segment rows. A
``MemoryAsyncPool`` fires no memory hook at all, so its ``malloc`` logs the
malloc row itself (with the call-site and ``cudaMemGetInfo``'s free bytes)
and hands out the block through ``UnownedMemory`` whose owner logs the free
row when the program drops the block. Pools built directly from
``SingleDeviceMemoryPool``, allocators that are no pool (``malloc_async``
alone) and pools made before recording began are not covered.

The trace's ``pool`` column counts (pool, device) pairs: id i is entry i of
the ``pools`` metadata list (``id``, ``device``, ``kind``, ``label``,
``limit_bytes``); id 0 is the recorder's default pool on the starting device.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import weakref
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from tracekit.record.device_alloc import (
    SegmentLog,
    async_pool_state,
    pool_state,
    raw_device_alloc,
    wrapped_alloc,
)
from tracekit.record.hook import FREE, MALLOC, OOM, UNMEASURED, EventBuffer, code_of
from tracekit.record.sites import SiteTable


class PoolKind(StrEnum):
    """What a pool is (``pools[].kind``)."""

    POOL = "pool"  # a CuPy MemoryPool (or PyTorch's caching allocator)
    ASYNC = "async"  # a CuPy MemoryAsyncPool: stream-ordered, device-level
    CUDA = "cuda"  # plain device allocations


class PoolRegistry:
    """The pools seen so far and the trace's pool ids; ``patch()`` installs the pool classes."""

    def __init__(self, cupy: Any, buffer: EventBuffer, *, sites: SiteTable | None,
                 oom_state: Callable[[int, Any, PoolKind], dict[str, Any]],
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.cupy, self.rt = cupy, cupy.cuda.runtime
        self.buffer, self.sites, self.clock = buffer, sites, clock
        self._oom_state = oom_state
        self.entries: list[dict[str, Any]] = []
        self._ids: dict[tuple[int, int], int] = {}
        self._pools: list[tuple[Any, PoolKind, str]] = []  # key -> (weakref to pool, kind, label)
        self.logs: list[SegmentLog] = []
        self._lock = threading.Lock()
        self._undo: list[tuple[Any, str, Any]] = []
        self.active = True

    # -- ids -----------------------------------------------------------------------------------
    def add(self, pool: Any, kind: PoolKind, label: str | None = None) -> int:
        with self._lock:
            key = len(self._pools)
            stem = "async" if kind is PoolKind.ASYNC else "user"
            n = sum(1 for _, k, lab in self._pools if k is kind and lab.startswith(stem))
            lab = label or f"{stem} {n + 1}"
            self._pools.append((weakref.ref(pool), kind, lab))
            return key

    def pool_id(self, key: int, device: int) -> int:
        got = self._ids.get((key, device))
        if got is not None:
            return got
        with self._lock:
            got = self._ids.get((key, device))
            if got is None:
                _, kind, label = self._pools[key]
                got = self._ids[(key, device)] = len(self.entries)
                entry = {"id": got, "device": device, "kind": kind.value, "label": label,
                         "limit_bytes": None}
                self.entries.append({**entry, "key": key})
                # a note, so a spool recovered after a kill still names its pools
                self.buffer.annotate({"kind": "pool", "entry": entry}, self.clock)
            return got

    def kind(self, key: int) -> PoolKind:
        return self._pools[key][1]

    def key_of(self, pool: Any) -> int | None:
        for key, (ref, _, _) in enumerate(self._pools):
            if ref() is pool:
                return key
        return None

    def installed(self) -> tuple[int | None, Any]:
        """The registered pool behind the current allocator (key, pool), else (None, None)."""
        pool = getattr(self.cupy.cuda.get_allocator(), "__self__", None)
        key = None if pool is None else self.key_of(pool)
        return key, (pool if key is not None else None)

    # -- measurements ---------------------------------------------------------------------------
    def free_bytes(self, device: int) -> int:
        """cudaMemGetInfo free bytes of ``device`` (the current device is switched only if needed)."""
        rt = self.rt
        prev = rt.getDevice()
        if prev == device:
            return int(rt.memGetInfo()[0])
        rt.setDevice(device)
        try:
            return int(rt.memGetInfo()[0])
        finally:
            rt.setDevice(prev)

    def segment_log(self, key: int, allocator: Callable[[int], Any] | None) -> SegmentLog:
        memory = self.cupy.cuda.memory
        own = allocator is None or allocator is getattr(memory, "_malloc", None)
        malloc, free = raw_device_alloc(self.rt) if own else wrapped_alloc(allocator)  # type: ignore[arg-type]
        log = SegmentLog(self.buffer, device_malloc=malloc, device_free=free,
                         current_stream=self.cupy.cuda.get_current_stream,
                         pool_id=lambda device: self.pool_id(key, device), free_bytes=self.free_bytes,
                         clock=self.clock)
        self.logs.append(log)
        return log

    def make_pool(self, allocator: Callable[[int], Any] | None = None, label: str | None = None) -> Any:
        """A recorded MemoryPool (``label`` names it in the metadata)."""
        return self.classes[0](allocator, _tracekit_label=label)

    # -- classes --------------------------------------------------------------------------------
    def patch(self) -> None:
        """Install the recorded pool classes under CuPy's names (``unpatch`` puts CuPy's back)."""
        cupy, reg = self.cupy, self
        memory = cupy.cuda.memory

        class MemoryPool(memory.MemoryPool):  # type: ignore[misc, name-defined]
            __doc__ = memory.MemoryPool.__doc__

            def __init__(self, allocator: Any = None, *, _tracekit_label: str | None = None) -> None:
                key = reg.add(self, PoolKind.POOL, _tracekit_label)
                log = reg.segment_log(key, allocator)
                self._tracekit_allocator = cupy.cuda.PythonFunctionAllocator(log.malloc, log.free)
                super().__init__(self._tracekit_allocator.malloc)

        class MemoryAsyncPool(memory.MemoryAsyncPool):  # type: ignore[misc, name-defined]
            __doc__ = memory.MemoryAsyncPool.__doc__

            def __init__(self, pool_handles: Any = "current") -> None:
                super().__init__(pool_handles)
                self._tracekit_key = reg.add(self, PoolKind.ASYNC)

            def malloc(self, size: int) -> Any:
                return reg.async_malloc(self, super().malloc, size)

        self.classes = (MemoryPool, MemoryAsyncPool)
        for owner in (cupy.cuda, memory):
            for name, cls in (("MemoryPool", MemoryPool), ("MemoryAsyncPool", MemoryAsyncPool)):
                self._undo.append((owner, name, getattr(owner, name)))
                setattr(owner, name, cls)

    def unpatch(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        self.active = False
        for log in self.logs:
            log.active = False

    # -- the async pool's rows -------------------------------------------------------------------
    def async_malloc(self, pool: Any, malloc: Callable[[int], Any], size: int) -> Any:
        cupy = self.cupy
        if not self.active:
            return malloc(size)
        device = int(self.rt.getDevice())
        pid = self.pool_id(pool._tracekit_key, device)
        site = self.sites.site_of(sys._getframe(1)) if self.sites is not None else -1
        rounded = (size + 511) // 512 * 512
        try:
            mp = malloc(size)
        except MemoryError as e:
            state = self._oom_state(device, pool, PoolKind.ASYNC)
            self._log_oom(device, pid, site, size, rounded, e, state)
            raise
        if not mp.ptr:
            return mp
        ptr = int(mp.ptr)
        stream = cupy.cuda.get_current_stream().ptr
        self.buffer.extend((self.clock(), code_of(MALLOC, device, pid, site), ptr, size, rounded, stream,
                            self._measure(device)))
        owner = _AsyncBlock(self, mp, device, pid, rounded)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, mp.mem.size, owner, device), 0)

    def async_free(self, device: int, pid: int, ptr: int, rounded: int) -> None:
        if not self.active:
            return
        stream = self.cupy.cuda.get_current_stream().ptr
        self.buffer.extend((self.clock(), code_of(FREE, device, pid), ptr, rounded, 0, stream,
                            self._measure(device)))

    def _measure(self, device: int) -> int:
        try:
            return self.free_bytes(device)
        except Exception:
            return UNMEASURED

    def _log_oom(self, device: int, pid: int, site: int, size: int, rounded: int, exc: BaseException,
                 state: dict[str, Any]) -> None:
        free = state.get("mem_free")
        counters = state.get("pool") or {}
        note = {"kind": "oom", "device": device, "size": size, "rounded": rounded,
                "exception": type(exc).__name__, "message": str(exc), "pool_id": pid,
                "used_bytes": counters.get("used_bytes"), "total_bytes": counters.get("total_bytes"),
                "limit": counters.get("limit_bytes"), "state": state}
        row = (self.clock(), code_of(OOM, device, pid, site), 0, size, rounded,
               self.cupy.cuda.get_current_stream().ptr, UNMEASURED if free is None else int(free))
        index = self.buffer.note(row, note, self.clock)
        with contextlib.suppress(AttributeError):
            exc._tracekit_oom_note = index  # type: ignore[attr-defined]

    # -- metadata -------------------------------------------------------------------------------
    def counters(self, key: int, device: int) -> dict[str, Any] | None:
        """The pool's own counters on ``device`` now, or None if the program dropped the pool."""
        ref, kind, _ = self._pools[key]
        pool = ref()
        if pool is None:
            return None
        with self.cupy.cuda.Device(device):
            return async_pool_state(pool) if kind is PoolKind.ASYNC else pool_state(pool)

    def metadata(self) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None]]:
        """(``pools`` entries with their limits, each entry's counters now) for the end of the trace."""
        pools, ends = [], []
        for e in self.entries:
            try:
                end = self.counters(e["key"], e["device"])
            except Exception as err:  # a device left in an error state: keep the entry
                end = {"error": f"{type(err).__name__}: {err}"}
            entry = {k: v for k, v in e.items() if k != "key"}
            if end and "error" not in end:
                entry["limit_bytes"] = end.get("limit_bytes")
            pools.append(entry)
            ends.append(end)
        return pools, ends


class _AsyncBlock:
    """Owner of one async-pool block handed to the program: logs the free when the block is dropped."""

    __slots__ = ("device", "mp", "pid", "ptr", "reg", "rounded")

    def __init__(self, reg: PoolRegistry, mp: Any, device: int, pid: int, rounded: int) -> None:
        self.reg, self.mp, self.device, self.pid, self.rounded = reg, mp, device, pid, rounded
        self.ptr = int(mp.ptr)

    def __del__(self) -> None:
        self.mp = None  # cudaFreeAsync on the block's stream, as CuPy's MemoryAsync does
        with contextlib.suppress(Exception):  # interpreter shutdown or a broken device: the free happened
            self.reg.async_free(self.device, self.pid, self.ptr, self.rounded)
