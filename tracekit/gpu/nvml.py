"""NVML through ``nvidia-ml-py`` (``pynvml``, NVIDIA's binding): memory figures and compute processes.

NVML answers without creating a CUDA context, which is what makes it the right witness for
"before this process touched the device". Only the few calls the budget and the recorder's
OOM probe need are used; every failure becomes ``None`` (``nvidia-ml-py`` or the NVML library
missing, a driver without the ``_v2`` memory call), never an exception, so the budget degrades
to "not measured" instead of failing. ``nvidia-ml-py`` is in the ``gpu`` extra; it is imported
on first use, so a process that never asks NVML does not load it.

Bytes, as NVML gives them: ``nvmlDeviceGetMemoryInfo`` with ``nvmlMemory_v2`` has
``total = reserved + used + free`` (``reserved``: the driver's and firmware's share, never
any process's); the v1 call folds ``reserved`` into ``used`` (``used_v1``). A process whose
bytes NVML hides (``NVML_VALUE_NOT_AVAILABLE``) has ``None``. ``tests/gpu/test_nvml_gpu.py``
checks every figure against a direct ctypes reading of the same calls.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any


@dataclass(frozen=True)
class NvmlMemory:
    """One NVML reading, bytes. ``reserved`` is None where only the v1 call exists."""

    total: int
    reserved: int | None
    free: int
    used: int
    used_v1: int | None


def _binding() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class Nvml:
    """An initialised NVML library; use as a context manager (``nvmlShutdown`` on exit)."""

    def __init__(self) -> None:
        self.lib: ModuleType | None = _binding()
        if self.lib is not None:
            try:
                self.lib.nvmlInit()
            except Exception:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no NVML here
                self.lib = None

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lib is not None:
            with contextlib.suppress(Exception):
                self.lib.nvmlShutdown()
            self.lib = None

    @property
    def available(self) -> bool:
        return self.lib is not None

    def _call(self, name: str, *args: Any) -> Any:
        """``pynvml.<name>(*args)``, or None when NVML is missing or the call fails."""
        if self.lib is None:
            return None
        try:
            return getattr(self.lib, name)(*args)
        except Exception:  # an NVMLError (not supported, not found, ...) or a binding without the call
            return None

    def _handle(self, index: int | str) -> Any:
        """A device handle from an NVML index, or from a PCI bus id (robust to CUDA_VISIBLE_DEVICES)."""
        if isinstance(index, str):
            return self._call("nvmlDeviceGetHandleByPciBusId", index)
        return self._call("nvmlDeviceGetHandleByIndex", index)

    def memory(self, index: int | str) -> NvmlMemory | None:
        """Memory figures of GPU ``index`` (NVML enumeration order; see CUDA_VISIBLE_DEVICES caveat)."""
        h = self._handle(index)
        if h is None or self.lib is None:
            return None
        v1 = self._call("nvmlDeviceGetMemoryInfo", h)
        used_v1 = None if v1 is None else int(v1.used)
        version = getattr(self.lib, "nvmlMemory_v2", None)
        v2 = None if version is None else self._call("nvmlDeviceGetMemoryInfo", h, version)
        if v2 is not None and hasattr(v2, "reserved"):
            return NvmlMemory(int(v2.total), int(v2.reserved), int(v2.free), int(v2.used), used_v1)
        if v1 is None:
            return None
        return NvmlMemory(int(v1.total), None, int(v1.free), int(v1.used), used_v1)

    def processes(self, index: int | str) -> list[tuple[int, int | None]] | None:
        """(pid, bytes or None where NVML hides it) of compute processes on GPU ``index``."""
        h = self._handle(index)
        if h is None:
            return None
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", h)
        if procs is None:
            return None
        out = []
        for p in procs:
            used = p.usedGpuMemory  # the binding gives None for NVML_VALUE_NOT_AVAILABLE
            out.append((int(p.pid), None if used is None or int(used) >= 2**63 else int(used)))
        return out

    def name(self, index: int | str) -> str | None:
        h = self._handle(index)
        return None if h is None else _text(self._call("nvmlDeviceGetName", h))

    def driver_version(self) -> str | None:
        return _text(self._call("nvmlSystemGetDriverVersion"))


def _text(v: str | bytes | None) -> str | None:
    """The binding returns ``str`` (bytes in releases before 11.5)."""
    return v.decode(errors="replace") if isinstance(v, bytes) else v
