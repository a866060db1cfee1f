"""Does this process already hold a CUDA context on a device? Asked of the driver, creating none.

``cuDevicePrimaryCtxGetState`` reports whether the primary context (the one
the runtime, CuPy and PyTorch share) is active, and ``cuInit`` creates no
context, so the budget can tell "measured before this process touched the
device" from "this process already holds memory there".
"""

from __future__ import annotations

import ctypes


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
