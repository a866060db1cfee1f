"""A minimal NVML binding over ctypes: memory figures and compute processes of one GPU.

NVML answers without creating a CUDA context, which is what makes it the
right witness for "before this process touched the device". Only the few
calls the budget and the recorder's OOM probe need are bound; every failure
becomes ``None`` (NVML missing, an old driver without the ``_v2`` memory
call), never an exception, so the budget degrades to "not measured" instead
of failing.

Why ctypes and not ``nvidia-ml-py`` (``pynvml``), the maintained binding:
the figures here are measured on the GPU machine, which may not have
``nvidia-ml-py`` installed (CuPy and PyTorch do not bring it), so it would
have to be an optional path with this one kept as the fallback anyway; and a
switch changes which structures are passed to ``nvmlDeviceGetMemoryInfo_v2``
(the ``reserved`` term of the budget equation) and
``nvmlDeviceGetComputeRunningProcesses_v3``, which only a run on a GPU can
show to give the same bytes. Until that run, this one path (exercised by the
GPU tests of the budget and of ``record``) stays the only one.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

_NVML_SUCCESS = 0


class _MemoryV1(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _MemoryV2(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_t as used by GetComputeRunningProcesses_v3
    _fields_ = [
        ("pid", ctypes.c_uint),
        ("usedGpuMemory", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


@dataclass(frozen=True)
class NvmlMemory:
    """One NVML reading, bytes. ``reserved`` is None where only the v1 call exists."""

    total: int
    reserved: int | None
    free: int
    used: int
    used_v1: int | None


class Nvml:
    """An initialised NVML library; use as a context manager (``nvmlShutdown`` on exit)."""

    def __init__(self) -> None:
        self.lib: ctypes.CDLL | None = None
        for name in ("libnvidia-ml.so.1", "libnvidia-ml.so", "nvml.dll"):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if self.lib is not None and self.lib.nvmlInit_v2() != _NVML_SUCCESS:
            self.lib = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lib is not None:
            self.lib.nvmlShutdown()
            self.lib = None

    @property
    def available(self) -> bool:
        return self.lib is not None

    def _handle(self, index: int | str) -> ctypes.c_void_p | None:
        """A device handle from an NVML index, or from a PCI bus id (robust to CUDA_VISIBLE_DEVICES)."""
        if self.lib is None:
            return None
        h = ctypes.c_void_p()
        if isinstance(index, str):
            rc = self.lib.nvmlDeviceGetHandleByPciBusId_v2(index.encode(), ctypes.byref(h))
        else:
            rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h))
        return h if rc == _NVML_SUCCESS else None

    def memory(self, index: int | str) -> NvmlMemory | None:
        """Memory figures of GPU ``index`` (NVML enumeration order; see CUDA_VISIBLE_DEVICES caveat)."""
        h = self._handle(index)
        if h is None or self.lib is None:
            return None
        v1 = _MemoryV1()
        used_v1 = None
        if self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(v1)) == _NVML_SUCCESS:
            used_v1 = int(v1.used)
        v2 = _MemoryV2()
        v2.version = ctypes.sizeof(_MemoryV2) | (2 << 24)
        try:
            rc = self.lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(v2))
        except AttributeError:
            rc = -1
        if rc == _NVML_SUCCESS:
            return NvmlMemory(int(v2.total), int(v2.reserved), int(v2.free), int(v2.used), used_v1)
        if used_v1 is None:
            return None
        return NvmlMemory(int(v1.total), None, int(v1.free), int(v1.used), used_v1)

    def processes(self, index: int | str) -> list[tuple[int, int | None]] | None:
        """(pid, bytes or None where NVML hides it) of compute processes on GPU ``index``."""
        h = self._handle(index)
        if h is None or self.lib is None:
            return None
        for fn_name in ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"):
            fn = getattr(self.lib, fn_name, None)
            if fn is None:
                continue
            count = ctypes.c_uint(64)
            buf = (_ProcessInfo * 64)()
            if fn(h, ctypes.byref(count), buf) != _NVML_SUCCESS:
                continue
            out = []
            for p in buf[: count.value]:
                used = int(p.usedGpuMemory)
                out.append((int(p.pid), None if used >= 2**63 else used))  # NVML_VALUE_NOT_AVAILABLE
            return out
        return None

    def name(self, index: int | str) -> str | None:
        h = self._handle(index)
        if h is None or self.lib is None:
            return None
        buf = ctypes.create_string_buffer(96)
        if self.lib.nvmlDeviceGetName(h, buf, ctypes.c_uint(96)) != _NVML_SUCCESS:
            return None
        return buf.value.decode(errors="replace")

    def driver_version(self) -> str | None:
        if self.lib is None:
            return None
        buf = ctypes.create_string_buffer(96)
        if self.lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)) != _NVML_SUCCESS:
            return None
        return buf.value.decode(errors="replace")
