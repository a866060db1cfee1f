"""PyTorch's CUDA caching allocator as the allocator of a device replay.

``TorchBackend`` drives the process's own allocator on one device:

- ``start`` empties its cache (and refuses when live tensors keep memory
  reserved: a replay must start from an empty allocator), applies the planned
  settings with ``torch.cuda.memory._set_allocator_settings`` and checks them
  against the allocator's own report, sets the per-process limit
  (``set_per_process_memory_fraction``, exact to the byte; see
  ``torch_settings.fraction_for``), creates one stream per recorded stream
  (recorded stream 0, the default stream, stays the default stream; made
  before the free memory is measured, as PyTorch keeps its stream pool) and
  turns the memory history on without stack capture
  (``_record_memory_history(enabled="all", context=None)``), leaving out the
  entries of frees where PyTorch can (``skip_actions``): a free here never
  moves device memory, so only allocations, failures and segment events are
  needed to place the segment events;
- ``alloc``/``delete`` are ``torch._C._cuda_cudaCachingAllocator_raw_alloc(size,
  stream)`` and ``..._raw_delete(ptr)``, the calls under
  ``torch.cuda.caching_allocator_alloc``/``caching_allocator_delete`` without
  their per-call device lookup and device switch (the device is made current
  once). A block goes back to the pool of the stream it was allocated on,
  whichever stream frees it, and no ``record_stream`` use is recorded, so a
  free takes effect at once, where the trace's ``free`` row (PyTorch's
  ``free_completed``) puts it;
- ``harvest`` reads the history gathered since the last harvest
  (``torch.cuda.memory._snapshot()``), turns it into columns with the snapshot
  importer (``tracekit.importers.torch_columns``) and clears it, so host memory
  stays bounded by one chunk of requests;
- ``close`` turns the history off, empties the cache, restores the previous
  settings and limit and the current device, on every way out.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any

import numpy as np

from tracekit.device.torch_loop import history_of
from tracekit.device.torch_settings import SettingsPlan, check_applied, fraction_for
from tracekit.errors import DeviceError, UsageError
from tracekit.importers import torch_columns as tc
from tracekit.units import format_size

HISTORY_ENTRIES = 1 << 22  # ring buffer length; a chunk of requests makes at most ~3 entries each


def import_torch(purpose: str) -> Any:
    """The ``torch`` module with a usable CUDA device, or DeviceError naming what is missing."""
    try:
        import torch
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        raise DeviceError(f"PyTorch is not importable ({type(e).__name__}: {e}); {purpose}") from None
    if not torch.cuda.is_available():
        raise DeviceError(f"PyTorch sees no CUDA device; {purpose}")
    return torch


def set_allocator_settings(torch: Any, conf: str) -> None:
    """``_set_allocator_settings(conf)``: the accelerator-wide call where PyTorch has it (the
    ``torch.cuda.memory`` one is deprecated there and warns), else the CUDA one."""
    fn = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    if fn is not None:
        fn(conf)
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.cuda.memory._set_allocator_settings(conf)


class TorchBackend:
    """The process's PyTorch caching allocator on ``device``, set up for one replay."""

    def __init__(self, device: int, plan: SettingsPlan, capacity: int | None) -> None:
        torch = import_torch("--allocator torch needs PyTorch with CUDA")
        n = torch.cuda.device_count()
        if not 0 <= device < n:
            raise DeviceError(f"--device {device} does not exist (PyTorch sees {n} CUDA device(s))")
        self.torch, self.device, self.plan, self.capacity = torch, device, plan, capacity
        self.oom_error = torch.OutOfMemoryError
        self.alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
        self.delete = torch._C._cuda_cudaCachingAllocator_raw_delete
        self._cudart = torch.cuda.cudart()
        self._prev_device = torch.cuda.current_device()
        self._prev: tuple[str, bool, float] | None = None
        self._streams: dict[int, Any] = {}
        self.settings: dict[str, Any] = {}
        self.history = False

    def free_total(self) -> tuple[int, int]:
        """cudaMemGetInfo of the device: (free, total) bytes."""
        free, total = self._cudart.cudaMemGetInfo(self.device)
        return int(free), int(total)

    def device_free(self) -> int:
        return int(self._cudart.cudaMemGetInfo(self.device)[0])

    def open_streams(self, recorded_streams: np.ndarray) -> np.ndarray:
        """The replay's stream handle for each recorded stream given (made current device first).

        Called before the free memory is measured: PyTorch makes its pool of side
        streams (32 per priority) at the first ``torch.cuda.Stream()`` and keeps it,
        with the device memory the driver gives each, for the life of the process.
        """
        t = self.torch
        t.cuda.set_device(self.device)
        handles = np.zeros(len(recorded_streams), np.int64)
        for i, s in enumerate(int(x) for x in recorded_streams):
            if s not in self._streams:
                made = t.cuda.default_stream(self.device) if s == 0 else t.cuda.Stream(self.device)
                self._streams[s] = made
            handles[i] = int(self._streams[s].cuda_stream)
        t.cuda.synchronize(self.device)
        return handles

    def start(self) -> None:
        """Empty cache, settings, limit, history on (after ``open_streams``)."""
        t = self.torch
        t.cuda.empty_cache()
        held = int(t.cuda.memory_reserved(self.device))
        if held:
            raise DeviceError(
                f"device {self.device}: PyTorch's allocator in this process still holds {format_size(held)} "
                "for live tensors; a replay needs it empty"
            )
        before = t.cuda.memory._snapshot().get("allocator_settings") or {}
        self._prev = (str(before.get("PYTORCH_CUDA_ALLOC_CONF") or ""),
                      bool(before.get("expandable_segments")),
                      self._fraction())
        self._apply(self.plan.conf)
        report = t.cuda.memory._snapshot().get("allocator_settings")
        check_applied(self.plan, report)
        self.settings = dict(report) if isinstance(report, dict) else {}
        self._set_limit()
        self._history_on()

    def _fraction(self) -> float:
        get = getattr(self.torch.cuda, "get_per_process_memory_fraction", None)
        try:
            return float(get(self.device)) if get is not None else 1.0
        except Exception:  # a PyTorch without it: no limit was set through this process's knowledge
            return 1.0

    def _apply(self, conf: str) -> None:
        """The settings string, or DeviceError with PyTorch's own first line when it refuses it.

        A PyTorch too old for ``max_non_split_rounding_mb`` gets the string without
        it when the key was not asked for (its default is then the only value).
        """
        try:
            set_allocator_settings(self.torch, conf)
        except RuntimeError as e:
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            if "max_non_split_rounding_mb" in first and "max_non_split_rounding_mb" not in self.plan.options:
                parts = [p for p in conf.split(",") if not p.startswith("max_non_split_rounding_mb:")]
                return self._apply(",".join(parts))
            raise DeviceError(f"PyTorch refused the allocator settings {conf!r}: {first}") from None

    def _set_limit(self) -> None:
        t = self.torch
        if self.capacity is not None:
            free, total = self.free_total()
            if self.capacity > free:
                raise UsageError(
                    f"--capacity {format_size(self.capacity)} is more than the device's free memory "
                    f"({format_size(free)} of {format_size(total)}); nothing was allocated")
            t.cuda.set_per_process_memory_fraction(fraction_for(self.capacity, total), self.device)
        elif self._prev is not None and self._prev[2] < 1.0:
            t.cuda.set_per_process_memory_fraction(1.0, self.device)  # a limit set earlier in this process

    def _history_on(self) -> None:
        record = self.torch.cuda.memory._record_memory_history
        try:  # a free never moves device memory here (no record_stream): its entries are not needed
            record(enabled="all", context=None, stacks="python", max_entries=HISTORY_ENTRIES,
                   skip_actions=["free_requested", "free_completed"])
        except (TypeError, ValueError, RuntimeError):  # a PyTorch without skip_actions: frees recorded too
            record(enabled="all", context=None, stacks="python", max_entries=HISTORY_ENTRIES)
        self.history = True

    def _history_off(self) -> None:
        if self.history:
            self.history = False
            self.torch.cuda.memory._record_memory_history(enabled=None)  # also clears the buffer

    def harvest(self) -> tc.History:
        """The history since the last harvest, as columns; the buffer starts empty again."""
        snap = self.torch.cuda.memory._snapshot()
        traces = snap.get("device_traces") or []
        entries = list(traces[self.device]) if self.device < len(traces) else []
        del snap, traces
        self._history_off()
        self._history_on()
        return history_of(entries)

    def release_cached(self) -> None:
        """``torch.cuda.empty_cache()``: what the program did where the trace shows a release."""
        self.torch.cuda.empty_cache()

    def stats(self) -> dict[str, int]:
        t, d = self.torch, self.device
        live, reserved = int(t.cuda.memory_allocated(d)), int(t.cuda.memory_reserved(d))
        return {"live_bytes": live, "reserved_bytes": reserved, "free_bytes": reserved - live}

    def recorded_stream(self, handle: int) -> int:
        """The trace's stream id for one of the replay's stream handles (the handle when unknown)."""
        for s, obj in self._streams.items():
            if int(obj.cuda_stream) == handle:
                return s
        return handle

    def close(self, live: list[int]) -> list[str]:
        """Free ``live`` blocks, empty the cache, restore settings, limit and device; returns errors."""
        errors: list[str] = []

        def attempt(what: str, fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except Exception as e:
                errors.append(f"{what}: {str(e).splitlines()[0] if str(e) else type(e).__name__}")

        t = self.torch
        attempt("turning the memory history off", self._history_off)
        for p in live:
            attempt(f"freeing block {int(p):#x}", self.delete, p)
        attempt("cudaDeviceSynchronize", t.cuda.synchronize, self.device)
        attempt("emptying the cache", t.cuda.empty_cache)
        if self._prev is not None:
            conf, expandable, fraction = self._prev
            restore = f"expandable_segments:{expandable}" + (f",{conf}" if conf else "")
            with contextlib.suppress(Exception):  # settings, not memory: a failure here takes nothing
                set_allocator_settings(t, restore)
                if self.capacity is not None:
                    t.cuda.set_per_process_memory_fraction(fraction, self.device)
        self._streams.clear()
        with contextlib.suppress(Exception):
            t.cuda.set_device(self._prev_device)
        return errors
