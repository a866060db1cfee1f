"""The device measured at an out-of-memory error: free memory, who holds it, the runtime limits.

``DeviceProbe.state(device, pool)`` returns one ``oom_states`` entry of trace
format v2 (without ``seq`` and ``t_ns``, which the trace writer adds):
``mem_free``/``mem_total`` from ``cudaMemGetInfo``; ``processes``, NVML's
per-process used bytes on the device, each with its pid, its name (Linux
``/proc/PID/comm``) and ``self`` for the recording process; ``limits``, the
current ``cudaLimitStackSize`` / ``cudaLimitMallocHeapSize`` /
``cudaLimitPrintfFifoSize`` values (bytes, per thread for the stack; read
through the driver, ``tracekit.gpu.driver``, where CuPy is absent); and
``pool``, the counters the caller passes. Each figure that cannot be
measured is None, never an exception: the program's own out-of-memory error
must reach it unchanged. The probe runs only at an OOM, so its cost (a few
driver calls, under a millisecond) never touches the per-event path.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from typing import Any

from tracekit.gpu.driver import LIMIT_CODES, driver_limits
from tracekit.gpu.nvml import Nvml


def process_name(pid: int) -> str | None:
    """The short command name of ``pid`` (Linux), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


class DeviceProbe:
    """Measures devices for ``oom_states``; ``close()`` shuts NVML down.

    ``mem_get_info(device)`` returns (free, total) bytes; ``limits(device)``
    the limits dict; ``nvml_key(device)`` the PCI bus id (or NVML index) of a
    CUDA ordinal, so CUDA_VISIBLE_DEVICES does not mislead NVML.
    """

    def __init__(self, mem_get_info: Callable[[int], tuple[int, int]],
                 limits: Callable[[int], dict[str, int | None]],
                 nvml_key: Callable[[int], int | str]) -> None:
        self._mem, self._limits, self._key = mem_get_info, limits, nvml_key
        self._nvml: Nvml | None = None
        with contextlib.suppress(Exception):  # no NVML: processes stay unmeasured
            self._nvml = Nvml()
        self.pid = os.getpid()

    def processes(self, device: int) -> list[dict[str, Any]] | None:
        if self._nvml is None or not self._nvml.available:
            return None
        try:
            procs = self._nvml.processes(self._key(device))
        except Exception:
            return None
        if procs is None:
            return None
        return [{"pid": pid, "name": process_name(pid), "used_bytes": used, "self": pid == self.pid}
                for pid, used in procs]

    def state(self, device: int, pool: dict[str, Any] | None) -> dict[str, Any]:
        """One ``oom_states`` entry for ``device`` now (``seq``/``t_ns`` are added by the writer)."""
        free: int | None = None
        total: int | None = None
        with contextlib.suppress(Exception):
            f, t = self._mem(device)
            free, total = int(f), int(t)
        limits: dict[str, int | None] = dict.fromkeys(LIMIT_CODES)
        with contextlib.suppress(Exception):
            limits = dict(self._limits(device))
        return {"device": device, "mem_free": free, "mem_total": total,
                "processes": self.processes(device), "limits": limits, "pool": pool}

    def close(self) -> None:
        if self._nvml is not None:
            self._nvml.__exit__(None, None, None)
            self._nvml = None


def cupy_probe(cupy: Any) -> DeviceProbe:
    """A probe through CuPy's runtime bindings (switching to the device asked for, then back)."""
    rt = cupy.cuda.runtime

    def on(device: int, fn: Callable[[], Any]) -> Any:
        prev = rt.getDevice()
        if prev == device:
            return fn()
        rt.setDevice(device)
        try:
            return fn()
        finally:
            rt.setDevice(prev)

    def mem(device: int) -> tuple[int, int]:
        free, total = on(device, rt.memGetInfo)
        return int(free), int(total)

    def limits(device: int) -> dict[str, int | None]:
        return on(device, lambda: {k: int(rt.deviceGetLimit(c)) for k, c in LIMIT_CODES.items()})

    def key(device: int) -> int | str:
        try:
            return str(rt.deviceGetPCIBusId(device))
        except Exception:
            return device

    return DeviceProbe(mem, limits, key)


def torch_probe(torch: Any) -> DeviceProbe:
    """A probe through PyTorch (memory) and the driver (limits of the device's primary context)."""

    def mem(device: int) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)

    def limits(device: int) -> dict[str, int | None]:
        with torch.cuda.device(device):
            return driver_limits()

    def key(device: int) -> int | str:
        try:
            props = torch.cuda.get_device_properties(device)
            return f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        except Exception:
            return device

    return DeviceProbe(mem, limits, key)
