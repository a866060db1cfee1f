"""Simulated devices: a bump allocator per device, cudaMemGetInfo, limits, a thread's current device."""

import os
import threading

errorMemoryAllocation = 2
GiB = 1 << 30
_N = int(os.environ.get("FAKECUPY_DEVICES", "1"))
_TOTAL = int(float(os.environ.get("FAKECUPY_GIB", "1")) * GiB)
_lock = threading.Lock()
_local = threading.local()
_used = [0] * _N
_next = [0x7F00_0000_0000 - (d << 40) for d in range(_N)]
_live = {}  # ptr -> (device, size)
_limits = {0: 1024, 1: 1 << 20, 2: 8 << 20}


class CUDARuntimeError(RuntimeError):
    def __init__(self, status):  # type: ignore[no-untyped-def]
        super().__init__("cudaErrorMemoryAllocation: out of memory")
        self.status = status


def getDeviceCount():  # type: ignore[no-untyped-def]
    return _N


def getDevice():  # type: ignore[no-untyped-def]
    return getattr(_local, "device", 0)


def setDevice(d):  # type: ignore[no-untyped-def]
    _local.device = d


def malloc(size):  # type: ignore[no-untyped-def]
    d = getDevice()
    with _lock:
        if _used[d] + size > _TOTAL:
            raise CUDARuntimeError(errorMemoryAllocation)
        ptr = _next[d]
        _next[d] += (size + 511) // 512 * 512
        _used[d] += size
        _live[ptr] = (d, size)
    return ptr


def free(ptr):  # type: ignore[no-untyped-def]
    with _lock:
        d, size = _live.pop(ptr)
        _used[d] -= size


_mempool_reserved_high = [0] * _N  # each device's current memory pool (what MemoryAsyncPool takes from)


def deviceGetMemPool(d):  # type: ignore[no-untyped-def]
    return 0x1000 + d


def memPoolGetAttribute(pool, attr):  # type: ignore[no-untyped-def]
    if attr != 0x6:  # only cudaMemPoolAttrReservedMemHigh is followed here
        raise ValueError(attr)
    return _mempool_reserved_high[pool - 0x1000]


class PointerAttributes:
    def __init__(self, device, devicePointer, hostPointer, type):  # type: ignore[no-untyped-def]
        self.device, self.devicePointer = device, devicePointer
        self.hostPointer, self.type = hostPointer, type


def pointerGetAttributes(ptr):  # type: ignore[no-untyped-def]
    """A freed (or never allocated) pointer is unregistered memory (type 0), as CUDA 11+ says."""
    with _lock:
        hit = _live.get(ptr)
    return PointerAttributes(-2, 0, 0, 0) if hit is None else PointerAttributes(hit[0], ptr, 0, 2)


def memGetInfo():  # type: ignore[no-untyped-def]
    d = getDevice()
    return _TOTAL - _used[d], _TOTAL


def deviceGetLimit(code):  # type: ignore[no-untyped-def]
    return _limits[code]


def deviceSetLimit(code, value):  # type: ignore[no-untyped-def]
    _limits[code] = value


def getDeviceProperties(d):  # type: ignore[no-untyped-def]
    return {"name": b"Fake GPU", "multiProcessorCount": 4, "maxThreadsPerMultiProcessor": 2048}


def deviceGetPCIBusId(d):  # type: ignore[no-untyped-def]
    return f"0000:F{d}:00.0"


def runtimeGetVersion():  # type: ignore[no-untyped-def]
    return 13020


def driverGetVersion():  # type: ignore[no-untyped-def]
    return 13020
