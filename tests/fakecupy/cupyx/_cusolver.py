"""Stands for ``cupyx/_cusolver.pyx``: a compiled module CuPy imports lazily (``cupy.linalg.eigh``).

At import it resolves the extension types it cimports from ``cupy.cuda.memory``
the way Cython does (``cupy._cython_import``), so it fails exactly where the
real module fails when a recorder has put something else under those names.
"""

from cupy import _cython_import
from cupy.cuda import memory

MemoryPointer = _cython_import.import_type(memory, "MemoryPointer")
MemoryPool = _cython_import.import_type(memory, "MemoryPool")
MemoryAsyncPool = _cython_import.import_type(memory, "MemoryAsyncPool")
PythonFunctionAllocator = _cython_import.import_type(memory, "PythonFunctionAllocator")


def workspace(size):  # type: ignore[no-untyped-def]
    """A solver's workspace from the current allocator, typed as the module's MemoryPointer."""
    ptr = memory.alloc(size)
    _cython_import.check_arg(ptr, MemoryPointer, "workspace")
    return ptr
