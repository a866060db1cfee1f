"""Memory objects, allocators and the two pool kinds, following cupy/cuda/memory.pyx (14.2).

The classes stand for Cython extension types and are as strict as those where it
matters to a recorder: each has ``__pyx_vtable__`` in its own ``__dict__`` (what a
module that ``cimport``s this one reads when it is imported, see
``cupy._cython_import``), the pools have no ``__dict__`` and take no weak
reference, and names are looked up at call time where the ``.pyx`` looks them up
in the module's namespace (``_malloc`` in the pools' constructors and in
``set_allocator(None)``); ``alloc`` calls ``get_allocator`` as the C function
(this module's own, whatever the namespace holds), as Cython does.
"""

import threading
import weakref

from cupy.cuda import memory_hook, runtime

_local = threading.local()


def _extension_type(cls):  # type: ignore[no-untyped-def]
    """Mark ``cls`` as a stand-in for a cdef class: its C vtable lives in its own ``__dict__``."""
    cls.__pyx_vtable__ = object()  # a PyCapsule in CuPy; only its presence and identity matter here
    return cls


class OutOfMemoryError(MemoryError):
    def __init__(self, size, total, limit=0):  # type: ignore[no-untyped-def]
        msg = f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes"
        msg += f", limit set to: {limit:,} bytes)." if limit else ")."
        super().__init__(msg)


@_extension_type
class Memory:
    def __init__(self, size):  # type: ignore[no-untyped-def]
        self.size, self.device_id = size, runtime.getDevice()
        self.ptr = runtime.malloc(size) if size else 0

    def __del__(self):  # type: ignore[no-untyped-def]
        if self.ptr:
            runtime.free(self.ptr)


@_extension_type
class UnownedMemory:
    def __init__(self, ptr, size, owner, device_id=-1):  # type: ignore[no-untyped-def]
        self.ptr, self.size, self._owner = ptr, size, owner
        self.device_id = runtime.getDevice() if device_id < 0 else device_id


class MemoryAsync(Memory):
    pass


class PythonFunctionAllocatorMemory:
    def __init__(self, size, malloc_func, free_func, device_id):  # type: ignore[no-untyped-def]
        self._free_func, self.device_id, self.size = free_func, device_id, size
        self.ptr = malloc_func(size, device_id) if size else 0

    def __del__(self):  # type: ignore[no-untyped-def]
        if self.ptr:
            self._free_func(self.ptr, self.device_id)


@_extension_type
class MemoryPointer:
    def __init__(self, mem, offset):  # type: ignore[no-untyped-def]
        self.mem, self.ptr, self.device_id = mem, mem.ptr + offset, mem.device_id


def _malloc(size):  # type: ignore[no-untyped-def]
    return MemoryPointer(Memory(size), 0)


_current_allocator = _malloc


def _get_thread_local_allocator():  # type: ignore[no-untyped-def]
    return getattr(_local, "allocator", None)


def _set_thread_local_allocator(allocator):  # type: ignore[no-untyped-def]
    _local.allocator = allocator


def set_allocator(allocator=None):  # type: ignore[no-untyped-def]
    global _current_allocator
    if allocator is None:
        allocator = _malloc
    if getattr(_local, "allocator", None) is not None:
        raise ValueError("Can't change the global allocator inside `using_allocator` context manager")
    _current_allocator = allocator


def get_allocator():  # type: ignore[no-untyped-def]
    return getattr(_local, "allocator", None) or _current_allocator


_c_get_allocator = get_allocator  # what compiled callers reach (a cpdef function's C entry)


def alloc(size):  # type: ignore[no-untyped-def]
    return _c_get_allocator()(size)


@_extension_type
class PythonFunctionAllocator:
    def __init__(self, malloc_func, free_func):  # type: ignore[no-untyped-def]
        self._malloc_func, self._free_func = malloc_func, free_func

    def malloc(self, size):  # type: ignore[no-untyped-def]
        mem = PythonFunctionAllocatorMemory(size, self._malloc_func, self._free_func, runtime.getDevice())
        return MemoryPointer(mem, 0)


def _stream_ptr():  # type: ignore[no-untyped-def]
    import cupy.cuda

    return cupy.cuda.get_current_stream().ptr


class PooledMemory:
    def __init__(self, seg, size, stream, pool):  # type: ignore[no-untyped-def]
        self.seg, self.size, self.stream, self.pool = seg, size, stream, weakref.ref(pool)
        self.ptr, self.device_id = seg.ptr, seg.device_id

    def __del__(self):  # type: ignore[no-untyped-def]
        pool = self.pool()
        if pool is None:
            return
        hooks = list(memory_hook.get_memory_hooks().values())
        for h in hooks:
            h.free_preprocess(device_id=self.device_id, mem_size=self.size, mem_ptr=self.ptr,
                              pmem_id=id(self))
        try:
            pool._free(self)
        finally:
            for h in hooks:
                h.free_postprocess(device_id=self.device_id, mem_size=self.size, mem_ptr=self.ptr,
                                   pmem_id=id(self))


@_extension_type
class SingleDeviceMemoryPool:
    """Whole segments only (no splitting): enough to drive the recorder's rows and counters."""

    __slots__ = ("__weakref__", "_allocator", "_cache", "_device_id", "_limit", "_segs", "_total", "_used")

    def __init__(self, allocator=None):  # type: ignore[no-untyped-def]
        self._allocator = allocator if allocator is not None else _malloc
        self._device_id = runtime.getDevice()  # the device current at creation, as in CuPy
        self._cache = {}  # (stream, size) -> [MemoryPointer of a free segment]
        self._segs = {}  # ptr -> MemoryPointer of every segment
        self._used = 0
        self._total = 0  # counted before the device allocation is made, as CuPy's _try_block_total_bytes
        self._limit = 0

    def malloc(self, size):  # type: ignore[no-untyped-def]
        rounded = (size + 511) // 512 * 512
        hooks = list(memory_hook.get_memory_hooks().values())
        for h in hooks:
            h.malloc_preprocess(device_id=self._device_id, size=size, mem_size=rounded)
        mem = None
        try:
            mem = self._malloc(rounded)
        finally:
            for h in hooks:
                h.malloc_postprocess(device_id=self._device_id, size=size, mem_size=rounded,
                                     mem_ptr=mem.ptr if mem is not None else 0,
                                     pmem_id=id(mem.mem) if mem is not None else 0)
        return mem

    def _malloc(self, rounded):  # type: ignore[no-untyped-def]
        stream = _stream_ptr()
        free = self._cache.get((stream, rounded))
        seg = free.pop() if free else self._try_malloc(rounded)
        self._used += rounded
        return MemoryPointer(PooledMemory(seg, rounded, stream, self), 0)

    def _try_malloc(self, size):  # type: ignore[no-untyped-def]
        if self._limit and self._total + size > self._limit:
            self.free_all_blocks()
            if self._total + size > self._limit:
                raise OutOfMemoryError(size, self._total, self._limit)
        self._total += size
        for attempt in range(2):
            try:
                seg = self._alloc(size)
                self._segs[seg.ptr] = seg
                return seg
            except runtime.CUDARuntimeError:
                if attempt:
                    self._total -= size
                    raise OutOfMemoryError(size, self._total, self._limit) from None
                self.free_all_blocks()
        raise AssertionError

    def _alloc(self, size):  # type: ignore[no-untyped-def]
        hooks = list(memory_hook.get_memory_hooks().values())
        for h in hooks:
            h.alloc_preprocess(device_id=self._device_id, mem_size=size)
        seg = None
        try:
            seg = self._allocator(size)
        finally:
            for h in hooks:
                h.alloc_postprocess(device_id=self._device_id, mem_size=size,
                                    mem_ptr=seg.ptr if seg is not None else 0)
        return seg

    def _free(self, pmem):  # type: ignore[no-untyped-def]
        self._used -= pmem.size
        self._cache.setdefault((pmem.stream, pmem.size), []).append(pmem.seg)

    def free_all_blocks(self, stream=None):  # type: ignore[no-untyped-def]
        for (s, _), segs in self._cache.items():
            if stream is None or s == stream.ptr:
                for seg in segs:
                    del self._segs[seg.ptr]
                    self._total -= seg.mem.size
                segs.clear()

    def used_bytes(self):  # type: ignore[no-untyped-def]
        return self._used

    def total_bytes(self):  # type: ignore[no-untyped-def]
        return self._total

    def free_bytes(self):  # type: ignore[no-untyped-def]
        return self.total_bytes() - self._used

    def n_free_blocks(self):  # type: ignore[no-untyped-def]
        return sum(len(v) for v in self._cache.values())

    def set_limit(self, size=None, fraction=None):  # type: ignore[no-untyped-def]
        self._limit = int(size or 0)

    def get_limit(self):  # type: ignore[no-untyped-def]
        return self._limit


@_extension_type
class MemoryPool:
    __slots__ = ("_allocator", "_pools")  # a cdef class: no __dict__, no weak reference

    def __init__(self, allocator=None):  # type: ignore[no-untyped-def]
        self._allocator = allocator if allocator is not None else _malloc
        self._pools = None

    def device_pool(self):  # type: ignore[no-untyped-def]
        if self._pools is None:  # all devices' pools at once, stamped with the current device
            n = runtime.getDeviceCount()
            self._pools = tuple(SingleDeviceMemoryPool(self._allocator) for _ in range(n))
        return self._pools[runtime.getDevice()]

    def malloc(self, size):  # type: ignore[no-untyped-def]
        return self.device_pool().malloc(size)

    def __getattr__(self, name):  # type: ignore[no-untyped-def]
        if name in ("used_bytes", "total_bytes", "free_bytes", "n_free_blocks", "set_limit", "get_limit",
                    "free_all_blocks"):
            return getattr(self.device_pool(), name)
        raise AttributeError(name)


@_extension_type
class MemoryAsyncPool:
    __slots__ = ("_used",)

    def __init__(self, pool_handles="current"):  # type: ignore[no-untyped-def]
        self._used = [0] * runtime.getDeviceCount()

    def malloc(self, size):  # type: ignore[no-untyped-def]
        rounded = (size + 511) // 512 * 512
        try:
            mem = _AsyncMemory(rounded, self)
        except runtime.CUDARuntimeError:
            raise OutOfMemoryError(size, self.total_bytes(), 0) from None
        return MemoryPointer(mem, 0)

    def used_bytes(self):  # type: ignore[no-untyped-def]
        return self._used[runtime.getDevice()]

    def total_bytes(self):  # type: ignore[no-untyped-def]
        return self._used[runtime.getDevice()]

    def get_limit(self):  # type: ignore[no-untyped-def]
        return (1 << 64) - 1

    def free_all_blocks(self, stream=None):  # type: ignore[no-untyped-def]
        pass


class _AsyncMemory(Memory):
    def __init__(self, size, pool):  # type: ignore[no-untyped-def]
        super().__init__(size)
        self._pool = pool
        pool._used[self.device_id] += size
        high = runtime._mempool_reserved_high
        high[self.device_id] = max(high[self.device_id], pool._used[self.device_id])

    def __del__(self):  # type: ignore[no-untyped-def]
        self._pool._used[self.device_id] -= self.size
        super().__del__()


# The size each extension type had when the modules that cimport this one were compiled
# ("from C header" in Cython's check), fixed here at import as a compiler would fix it.
COMPILED_AGAINST = {cls.__name__: (cls, cls.__basicsize__) for cls in (
    Memory, UnownedMemory, MemoryPointer, PythonFunctionAllocator, SingleDeviceMemoryPool, MemoryPool,
    MemoryAsyncPool)}
