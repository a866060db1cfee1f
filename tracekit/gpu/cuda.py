"""Reaching the GPU through CuPy: one import and one device check for every GPU path.

Recording, device replay and the budget all need CuPy and a usable device;
each failure becomes one ``DeviceError`` sentence saying what the command
needed it for, never an ImportError or CUDA traceback.
"""

from __future__ import annotations

from typing import Any

from tracekit.errors import DeviceError


def import_cupy(purpose: str) -> Any:
    """The ``cupy`` module, or DeviceError: "CuPy is not importable (...); <purpose>"."""
    try:
        import cupy
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        raise DeviceError(f"CuPy is not importable ({type(e).__name__}: {e}); {purpose}") from None
    return cupy


def device_count(rt: Any) -> int:
    """Number of CUDA devices, or DeviceError when the driver cannot be reached."""
    try:
        return int(rt.getDeviceCount())
    except Exception as e:
        raise DeviceError(f"no CUDA device is usable ({e})") from None


def check_device(rt: Any, device: int, label: str = "device") -> None:
    """DeviceError unless ``device`` is an ordinal of this machine (``label`` names the option)."""
    n = device_count(rt)
    if not 0 <= device < n:
        raise DeviceError(f"{label} {device} does not exist (this machine has {n} CUDA device(s))")
