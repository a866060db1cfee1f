"""A pure-Python stand-in for the part of CuPy 14's memory API the recorder touches (CPU tests only).

It follows cupy/cuda/memory.pyx where the recorder depends on it: a
``MemoryPool`` makes one ``SingleDeviceMemoryPool`` per device on first use,
all stamped with the device current at that moment (so hooks report that id
for every device, as CuPy 14.2 does); the pool rounds to 512 bytes, caches
freed blocks by size and stream, asks its allocator for a new segment on a
miss, and on a failed allocation frees its cached blocks, retries and raises
``OutOfMemoryError``; hooks run in the thread's registry with CuPy's keyword
arguments, the postprocess ones in a ``finally``. ``MemoryAsyncPool`` fires no
hook. Devices are simulated (``FAKECUPY_DEVICES``, default 1, each
``FAKECUPY_GIB`` GiB). This package is put on ``sys.path`` only by the tests
that run a recording in a child process; it never shadows a real CuPy.
"""

from cupy import cuda, linalg  # noqa: F401

__version__ = "14.2.0+fake"

_default_memory_pool = cuda.MemoryPool()
cuda.set_allocator(_default_memory_pool.malloc)


def get_default_memory_pool():  # type: ignore[no-untyped-def]
    return _default_memory_pool


def empty(nbytes):  # type: ignore[no-untyped-def]
    """A 'array': the MemoryPointer of ``nbytes`` from the current allocator."""
    return cuda.alloc(nbytes)
