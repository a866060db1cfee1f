"""One test's PyTorch memory: the caching allocator's own peak counters, per device.

``start`` empties the cache (so the reserve of earlier tests is not this test's), resets the peak
statistics of every device and, when a trace is wanted, turns the allocation history on
(``torch.cuda.memory._record_memory_history``); ``stop`` reads ``max_memory_reserved`` and
``max_memory_allocated`` and the live bytes left (``memory_allocated`` minus the start's). The
"device" metric is the peak reserved plus what the device had in use outside the allocator at the
start (``mem_get_info``): PyTorch keeps no device-level peak. A trace is the snapshot
(``torch.cuda.memory._snapshot``) converted by tracekit's importer.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from tracekit.pytest.measure import Backend, DevicePeak, Measurement


def import_torch() -> tuple[Any, int]:
    """(torch, device count), or DeviceError saying why not."""
    from tracekit.errors import DeviceError

    try:
        import torch
    except Exception as e:
        raise DeviceError(f"PyTorch is not importable ({type(e).__name__}: {e})") from None
    if not torch.cuda.is_available():
        raise DeviceError("PyTorch sees no CUDA device")
    return torch, int(torch.cuda.device_count())


class TorchMeter:
    backend = Backend.TORCH

    def __init__(self, torch: Any, n_devices: int, *, history: bool, max_entries: int = 100_000) -> None:
        self.torch, self.n_devices, self.history, self.max_entries = torch, n_devices, history, max_entries
        self.snapshot: dict[str, Any] | None = None

    def start(self) -> None:
        cuda = self.torch.cuda
        self.base: dict[int, tuple[int, int, int]] = {}
        for d in range(self.n_devices):
            if not cuda.is_initialized():
                break  # nothing allocated yet: every counter is 0 (a device is not touched for it)
            cuda.empty_cache()
            cuda.reset_peak_memory_stats(d)
            free, total = cuda.mem_get_info(d)
            other = total - free - cuda.memory_reserved(d)
            self.base[d] = (cuda.memory_allocated(d), max(0, other), total)
        if self.history:
            cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                               max_entries=self.max_entries)

    def stop(self) -> Measurement:
        cuda = self.torch.cuda
        if self.history:
            with contextlib.suppress(Exception):
                self.snapshot = cuda.memory._snapshot()
            with contextlib.suppress(Exception):
                cuda.memory._record_memory_history(enabled=None)
        peaks: dict[int, DevicePeak] = {}
        if not cuda.is_initialized():
            return Measurement(self.backend, {}, 0)
        for d in range(self.n_devices):
            reserved, allocated = int(cuda.max_memory_reserved(d)), int(cuda.max_memory_allocated(d))
            if d not in self.base:  # the test initialized CUDA: what ran before it held nothing
                _free, total = cuda.mem_get_info(d) if reserved else (0, 0)
                self.base[d] = (0, 0, int(total))
            before, other, total = self.base[d]
            if reserved or allocated or d == 0:
                peaks[d] = DevicePeak(device=d, allocated=allocated, reserved=reserved,
                                      device_used=reserved + other, device_total=total,
                                      leaked=int(cuda.memory_allocated(d)) - before)
        return Measurement(self.backend, peaks, 0)

    def oom_text(self, exc: BaseException) -> str | None:
        if not isinstance(exc, self.torch.cuda.OutOfMemoryError):
            return None
        from tracekit.units import format_size as fs

        lines = [f"PyTorch out of memory: {str(exc).splitlines()[0][:500]}"]
        for d in range(self.n_devices):
            cuda = self.torch.cuda
            lines.append(f"device {d}: {fs(cuda.memory_allocated(d))} allocated, "
                         f"{fs(cuda.memory_reserved(d))} reserved (peak {fs(cuda.max_memory_reserved(d))})")
        return "\n".join(lines)

    def write_trace(self, output: Path, *, nodeid: str, exception: BaseException | None) -> Path | None:
        """The history of the test as a trace (None when no history was recorded)."""
        if self.snapshot is None:
            return None
        from tracekit.importers.torch_snapshot import convert
        from tracekit.trace import write_trace

        output.parent.mkdir(parents=True, exist_ok=True)
        c = convert(self.snapshot, output)
        meta = c.meta.with_extra(pytest={"nodeid": nodeid},
                                 exit={"status": "ok" if exception is None else "exception",
                                       "exception": None if exception is None else type(exception).__name__})
        write_trace(output, meta, c.events, c.extras)
        return output
