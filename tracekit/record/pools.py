"""Every CuPy pool a recorded program uses: ids, segment rows, and the async pool's own rows.

Nothing of CuPy's is replaced: no class (every Cython module that ``cimport``s
``cupy.cuda.memory`` checks at import that ``MemoryPool`` and the other cdef classes are the types
it was compiled against), no function, not the default pool. The recorder registers a
``MemoryHook`` (``tracekit.record.hook``) and reads CuPy's own state:

- block rows from the hook's malloc/free callbacks;
- segment rows from its alloc callbacks, with the ends CuPy does not show found by asking the
  pools and probing the pointers (``tracekit.record.device_alloc.HookedSegments``);
- a pool's id from the allocator installed in the thread when CuPy asks for device memory
  (``cupy.cuda.get_allocator().__self__``): CuPy's default pool is ``default``, every other
  ``MemoryPool`` (or ``SingleDeviceMemoryPool``) gets the next ``user N`` id when first seen. A
  pool whose ``malloc`` the program calls directly while another allocator is installed is counted
  as that one, and a pool behind an allocator function of the program's own (not ``pool.malloc``)
  as ``unattributed``.

A ``MemoryAsyncPool`` fires no memory hook at all. Only with ``record --async-pools`` are its
requests recorded, and that is the one case where the recorder replaces CuPy functions:
``set_allocator``/``get_allocator`` (in ``cupy.cuda`` and ``cupy.cuda.memory``) and
``memory._set_thread_local_allocator``/``_get_thread_local_allocator`` (what
``cupy.cuda.using_allocator`` calls), so that installing ``pool.malloc`` of an async pool installs
``AsyncAllocator``, which logs its malloc rows and hands the block out through an
``UnownedMemory`` whose owner logs the free (``get_allocator`` still returns what the program
installed). Without the option, a trace whose program installed an async pool says so
(``async_pools_unrecorded``).

The registry never keeps a pool alive beyond CuPy (only the default pool, which CuPy holds
anyway): pools are told apart by ``id()``, so a pool made after another one died, at the same
address, shares its id in the trace.

The trace's ``pool`` column counts (pool, device) pairs: id i is entry i of
the ``pools`` metadata list (``id``, ``device``, ``kind``, ``label``,
``limit_bytes``); id 0 is CuPy's default pool on the starting device.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from tracekit.record.callstacks import LiveStacks, capture_of
from tracekit.record.device_alloc import HookedSegments, async_pool_state, device_pointer, pool_state
from tracekit.record.hook import FREE, MALLOC, OOM, UNMEASURED, EventBuffer, code_of
from tracekit.record.sites import SiteTable
from tracekit.trace.live import round_up
from tracekit.trace.recorded import DEFAULT_POOL_LABEL, PoolKind

RESERVED_MEM_HIGH = 0x6  # cudaMemPoolAttrReservedMemHigh
UNATTRIBUTED = "unattributed"  # label of the pool id for segments made under a non-pool allocator


class AsyncAllocator:
    """What is installed in place of ``MemoryAsyncPool.malloc``: the pool's malloc, with rows."""

    __slots__ = ("key", "original", "pool", "reg")

    def __init__(self, reg: PoolRegistry, pool: Any, key: int, original: Any) -> None:
        self.reg, self.pool, self.key, self.original = reg, pool, key, original

    def __call__(self, size: int) -> Any:
        return self.reg.async_malloc(self.key, self.pool, self.original, size)


class PoolRegistry:
    """The pools seen so far and the trace's pool ids; ``patch()`` installs the recording functions."""

    def __init__(self, cupy: Any, buffer: EventBuffer, *, sites: SiteTable | None,
                 oom_state: Callable[[int, Any, PoolKind], dict[str, Any]],
                 clock: Callable[[], int] = time.perf_counter_ns, stacks: LiveStacks | None = None) -> None:
        self.cupy, self.rt, self.memory = cupy, cupy.cuda.runtime, cupy.cuda.memory
        self.buffer, self.sites, self.clock = buffer, sites, clock
        self.capture = capture_of(sites, stacks)  # (site, stack) of an async pool's request
        self._oom_state = oom_state
        self.entries: list[dict[str, Any]] = []
        self._ids: dict[tuple[int, int], int] = {}
        self._pools: list[tuple[PoolKind, str]] = []  # key -> (kind, label)
        self._key_by_id: dict[int, int] = {}  # id(pool) -> key
        self._owned: dict[int, Any] = {}  # key -> pool the recorder made (the default pool)
        self._global: tuple[int, Any] | None = None  # the pool behind the global allocator
        self._local = threading.local()  # .pool: (key, pool) behind this thread's allocator
        self._lock = threading.Lock()
        self._undo: list[tuple[Any, str, Any]] = []
        self.active = True
        self.patched = False  # the async pools' functions are installed (``patch``)
        self.unrecorded_async = False  # an async pool was installed while not patched
        self.segments = HookedSegments(buffer, pool_of=self.segment_pool, alive=device_pointer(self.rt),
                                       total_of=self._total, current_stream=cupy.cuda.get_current_stream,
                                       free_bytes=self.free_bytes, clock=clock)
        self.logs = [self.segments]
        memory = self.memory
        self._orig = {name: getattr(memory, name) for name in (
            "set_allocator", "get_allocator", "_set_thread_local_allocator", "_get_thread_local_allocator")}
        self._pool_types = ((memory.MemoryPool, memory.SingleDeviceMemoryPool), memory.MemoryAsyncPool)

    # -- ids -----------------------------------------------------------------------------------
    def add(self, pool: Any, kind: PoolKind, label: str | None = None, *, own: bool = False) -> int:
        """The key of ``pool`` (registered now if new; ``own``: the recorder keeps it alive)."""
        with self._lock:
            key = self._key_by_id.get(id(pool))
            if key is not None and self._pools[key][0] is kind:
                return key
            key = len(self._pools)
            stem = "async" if kind is PoolKind.ASYNC else "user"
            n = sum(1 for k, lab in self._pools if k is kind and lab.startswith(stem))
            self._pools.append((kind, label or f"{stem} {n + 1}"))
            if pool is not None:
                self._key_by_id[id(pool)] = key
            if own:
                self._owned[key] = pool
            return key

    def pool_id(self, key: int, device: int) -> int:
        got = self._ids.get((key, device))
        if got is not None:
            return got
        with self._lock:
            got = self._ids.get((key, device))
            if got is None:
                kind, label = self._pools[key]
                got = self._ids[(key, device)] = len(self.entries)
                entry = {"id": got, "device": device, "kind": kind.value, "label": label,
                         "limit_bytes": None}
                self.entries.append({**entry, "key": key})
                # a note, so a spool recovered after a kill still names its pools
                self.buffer.annotate({"kind": "pool", "entry": entry}, self.clock)
            return got

    def kind(self, key: int) -> PoolKind:
        return self._pools[key][0]

    def installed(self) -> tuple[int | None, Any]:
        """(key, pool) of the pool behind this thread's current allocator, else (None, None)."""
        allocator = self._orig["get_allocator"]()
        if isinstance(allocator, AsyncAllocator):
            return allocator.key, allocator.pool
        pool = getattr(allocator, "__self__", None)
        if isinstance(pool, self._pool_types[0]):
            return self.add(pool, PoolKind.POOL), pool
        if isinstance(pool, self._pool_types[1]):
            self.unrecorded_async = True  # its requests fire no hook (``record --async-pools``)
        return None, None

    def segment_pool(self, device: int) -> tuple[int, Any]:
        """(pool id, pool or None) of a segment CuPy asks for now (see the module docstring)."""
        key, pool = self.installed()
        if key is None:
            key, pool = self._unattributed(), None
        return self.pool_id(key, device), pool

    def async_seen(self, devices: set[int]) -> bool:
        """Whether stream-ordered memory was taken on any of ``devices`` in this process: the
        device's current memory pool has a reserved high-water mark (what a ``MemoryAsyncPool``
        allocates from; its requests fire no memory hook)."""
        for device in sorted(devices):
            try:
                with self.cupy.cuda.Device(device):
                    high = self.rt.memPoolGetAttribute(self.rt.deviceGetMemPool(device), RESERVED_MEM_HIGH)
            except Exception:  # no stream-ordered allocator on this device or driver
                continue
            if int(high) > 0:
                return True
        return False

    def _total(self, pool: Any, device: int) -> int:
        """``pool.total_bytes()`` on ``device`` (a ``MemoryPool`` answers for the current device)."""
        if int(self.rt.getDevice()) == device:
            return int(pool.total_bytes())
        with self.cupy.cuda.Device(device):
            return int(pool.total_bytes())

    def sweep(self) -> None:
        """End the segments CuPy freed unseen: every live one probed, but those of the pools the
        recorder can ask whose totals show nothing freed (``HookedSegments.sweep``)."""
        reach: dict[int, tuple[Any, int]] = {}
        for key, pool in self.reachable().items():
            if self.kind(key) is PoolKind.POOL:
                reach.update({pid: (pool, device) for (k, device), pid in self._ids.items() if k == key})
        self.segments.sweep(reach)

    def _unattributed(self) -> int:
        for key, (_, label) in enumerate(self._pools):
            if label == UNATTRIBUTED:
                return key
        return self.add(None, PoolKind.POOL, UNATTRIBUTED)

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

    def adopt_default(self, pool: Any) -> None:
        """CuPy's own default pool: pool key 0, ``default``."""
        self.add(pool, PoolKind.POOL, DEFAULT_POOL_LABEL, own=True)

    # -- the functions ----------------------------------------------------------------------------
    def _adopt(self, allocator: Any) -> tuple[Any, tuple[int, Any] | None]:
        """(what to install for the program's ``allocator``, (key, pool) behind it or None)."""
        if allocator is None:
            return None, None  # "no pool", as the program meant
        if isinstance(allocator, AsyncAllocator):
            return allocator, (allocator.key, allocator.pool)
        pool = getattr(allocator, "__self__", None)
        if isinstance(pool, self._pool_types[1]) and self.active:
            key = self.add(pool, PoolKind.ASYNC)
            return AsyncAllocator(self, pool, key, allocator), (key, pool)
        if isinstance(pool, self._pool_types[0]):
            return allocator, (self.add(pool, PoolKind.POOL), pool)
        return allocator, None

    def patch(self) -> None:
        """``record --async-pools``: the async pools' functions under CuPy's names (``unpatch`` puts
        CuPy's back); the only time the recorder replaces anything of CuPy's."""
        o = self._orig
        self.patched = True

        def set_allocator(allocator: Any = None) -> None:
            real, held = self._adopt(allocator)
            o["set_allocator"](real)
            self._global = held  # CuPy holds the pool now, so may we

        def get_allocator() -> Any:
            return _program_view(o["get_allocator"]())

        def _set_thread_local_allocator(allocator: Any) -> None:
            real, held = self._adopt(allocator) if allocator is not None else (None, None)
            o["_set_thread_local_allocator"](real)
            self._local.pool = held

        def _get_thread_local_allocator() -> Any:
            return _program_view(o["_get_thread_local_allocator"]())

        memory, cuda = self.memory, self.cupy.cuda
        new: dict[str, Any] = {}
        for fn in (set_allocator, get_allocator, _set_thread_local_allocator, _get_thread_local_allocator):
            new[fn.__name__] = functools.wraps(o[fn.__name__])(fn)
        for name, value in new.items():
            owners = [memory] + [cuda] * (getattr(cuda, name, None) is o[name])
            for owner in owners:
                self._undo.append((owner, name, getattr(owner, name)))
                setattr(owner, name, value)

    def unpatch(self) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()
        self.active = False
        for log in self.logs:
            log.active = False

    def detach(self) -> None:
        """In a forked child: log nothing more (the functions stay, passing every call through)."""
        self.active = False
        for log in self.logs:
            log.active = False

    # -- the async pool's rows -------------------------------------------------------------------
    def async_malloc(self, key: int, pool: Any, malloc: Callable[[int], Any], size: int) -> Any:
        cupy = self.cupy
        if not self.active:
            return malloc(size)
        device = int(self.rt.getDevice())
        pid = self.pool_id(key, device)
        site, stack = self.capture(sys._getframe(1))
        rounded = round_up(size)
        try:
            mp = malloc(size)
        except MemoryError as e:
            state = self._oom_state(device, pool, PoolKind.ASYNC)
            self._log_oom(device, pid, (site, stack), size, rounded, e, state)
            raise
        if not mp.ptr:
            return mp
        ptr = int(mp.ptr)
        stream = cupy.cuda.get_current_stream().ptr
        self.buffer.extend((self.clock(), code_of(MALLOC, device, pid, site), ptr, size, rounded, stream,
                            self._measure(device), stack))
        self.buffer.check()
        owner = _AsyncBlock(self, mp, device, pid, rounded)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(ptr, mp.mem.size, owner, device), 0)

    def async_free(self, device: int, pid: int, ptr: int, rounded: int) -> None:
        if not self.active:
            return
        stream = self.cupy.cuda.get_current_stream().ptr
        self.buffer.extend((self.clock(), code_of(FREE, device, pid), ptr, rounded, 0, stream,
                            self._measure(device), -1))
        self.buffer.check()

    def _measure(self, device: int) -> int:
        try:
            return self.free_bytes(device)
        except Exception:
            return UNMEASURED

    def _log_oom(self, device: int, pid: int, call: tuple[int, int], size: int, rounded: int,
                 exc: BaseException, state: dict[str, Any]) -> None:
        site, stack = call
        free = state.get("mem_free")
        counters = state.get("pool") or {}
        note = {"kind": "oom", "device": device, "size": size, "rounded": rounded,
                "exception": type(exc).__name__, "message": str(exc), "pool_id": pid,
                "used_bytes": counters.get("used_bytes"), "total_bytes": counters.get("total_bytes"),
                "limit": counters.get("limit_bytes"), "state": state}
        row = (self.clock(), code_of(OOM, device, pid, site), 0, size, rounded,
               self.cupy.cuda.get_current_stream().ptr, UNMEASURED if free is None else int(free), stack)
        index = self.buffer.note(row, note, self.clock)
        with contextlib.suppress(AttributeError):
            exc._tracekit_oom_note = index  # type: ignore[attr-defined]

    # -- metadata -------------------------------------------------------------------------------
    def reachable(self) -> dict[int, Any]:
        """The pools the recorder may read now (key -> pool): its own, and those CuPy holds here."""
        out = dict(self._owned)
        key, pool = self.installed()
        if key is not None:
            out.setdefault(key, pool)
        for held in (self._global, getattr(self._local, "pool", None)):
            if held is not None:
                out.setdefault(held[0], held[1])
        return out

    def counters(self, pool: Any, kind: PoolKind, device: int) -> dict[str, Any]:
        """The pool's own counters on ``device`` now."""
        with self.cupy.cuda.Device(device):
            return async_pool_state(pool) if kind is PoolKind.ASYNC else pool_state(pool)

    def metadata(self) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None]]:
        """(``pools`` entries with their limits, each entry's counters now: None where the program
        no longer holds the pool through an installed allocator) for the end of the trace."""
        pools, ends = [], []
        reach = self.reachable()
        for e in self.entries:
            pool = reach.get(e["key"])
            end: dict[str, Any] | None = None
            if pool is not None:
                try:
                    end = self.counters(pool, self.kind(e["key"]), e["device"])
                except Exception as err:  # a device left in an error state: keep the entry
                    end = {"error": f"{type(err).__name__}: {err}"}
            entry = {k: v for k, v in e.items() if k != "key"}
            if end and "error" not in end:
                entry["limit_bytes"] = end.get("limit_bytes")
            pools.append(entry)
            ends.append(end)
        return pools, ends


def _program_view(allocator: Any) -> Any:
    """What the program installed, where the recorder put an ``AsyncAllocator`` in its place."""
    return allocator.original if isinstance(allocator, AsyncAllocator) else allocator


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
