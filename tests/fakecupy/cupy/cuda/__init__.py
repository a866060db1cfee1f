"""cupy.cuda of the stand-in: runtime, streams, devices, allocators, pools and hooks."""

import contextlib
import threading

from cupy.cuda import memory, memory_hook, runtime  # noqa: F401
from cupy.cuda.memory import (  # noqa: F401
    MemoryAsyncPool,
    MemoryPointer,
    MemoryPool,
    PythonFunctionAllocator,
    UnownedMemory,
    alloc,
    get_allocator,
    set_allocator,
)
from cupy.cuda.memory_hook import MemoryHook  # noqa: F401


class Stream:
    def __init__(self, ptr=0):  # type: ignore[no-untyped-def]
        self.ptr = ptr


_null = Stream(0)
_local = threading.local()


def get_current_stream():  # type: ignore[no-untyped-def]
    return getattr(_local, "stream", _null)


@contextlib.contextmanager
def stream(s):  # type: ignore[no-untyped-def]
    prev = get_current_stream()
    _local.stream = s
    try:
        yield s
    finally:
        _local.stream = prev


class Device:
    def __init__(self, device=None):  # type: ignore[no-untyped-def]
        self.id = runtime.getDevice() if device is None else device

    def __enter__(self):  # type: ignore[no-untyped-def]
        self._prev = runtime.getDevice()
        runtime.setDevice(self.id)
        return self

    def __exit__(self, *exc):  # type: ignore[no-untyped-def]
        runtime.setDevice(self._prev)

    def synchronize(self):  # type: ignore[no-untyped-def]
        pass


@contextlib.contextmanager
def using_allocator(allocator=None):  # type: ignore[no-untyped-def]
    """As cupy/cuda/__init__.py: through the memory module's thread-local functions, by name."""
    if allocator is None:
        allocator = memory._malloc
    previous = memory._get_thread_local_allocator()
    memory._set_thread_local_allocator(allocator)
    try:
        yield
    finally:
        memory._set_thread_local_allocator(previous)
