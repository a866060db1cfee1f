"""The CUDA driver over ctypes: whether this process holds a context, and the runtime limits.

``cuDevicePrimaryCtxGetState`` reports whether the primary context (the one
the runtime, CuPy and PyTorch share) is active, and ``cuInit`` creates no
context, so the budget can tell "measured before this process touched the
device" from "this process already holds memory there". ``cuCtxGetLimit``
reads the limits of the context current in this thread (``LIMIT_CODES``:
``cudaLimit`` and ``CUlimit`` share the codes), for a recorder that has the
context but no CuPy (``record --torch``). Every failure is None, never an
exception: these calls run beside a program's own errors.
"""

from __future__ import annotations

import ctypes

LIMIT_CODES = {"stack_size": 0, "printf_fifo_size": 1, "malloc_heap_size": 2}  # cudaLimit == CUlimit


def primary_context_active(device: int) -> bool | None:
    """True/False from the driver; None where libcuda cannot answer."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    try:
        if lib.cuInit(0) != 0:
            return None
        dev = ctypes.c_int()
        if lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device)) != 0:
            return None
        flags = ctypes.c_uint()
        active = ctypes.c_int()
        if lib.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active)) != 0:
            return None
    except AttributeError:
        return None
    return bool(active.value)


def driver_limits() -> dict[str, int | None]:
    """The runtime limits of the context current in this thread, from the driver (``cuCtxGetLimit``)."""
    out: dict[str, int | None] = dict.fromkeys(LIMIT_CODES)
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        get = lib.cuCtxGetLimit
    except (OSError, AttributeError):
        return out
    for key, code in LIMIT_CODES.items():
        v = ctypes.c_size_t()
        if get(ctypes.byref(v), ctypes.c_int(code)) == 0:
            out[key] = int(v.value)
    return out
