"""A CuPy recording: install the recorded pool and hook, run, read the pool, write the trace.

``CupyRecording.start`` measures the cheap budget (before this process
touches the device), puts CuPy's default pool on the segment-logging
allocator, writes the start metadata into the spool, starts the flusher and
registers the hook in the calling thread and (through
``patch_threads``) in every ``threading.Thread`` started afterwards, since
CuPy keeps its hook registry per thread. ``stop`` unregisters, reads the
pool's own counters on every device used, flushes and finalizes the spool
into the v1 trace and removes the spool. ``record_cupy`` wraps it around
``runner.run_target``: the program's exit code and exception pass through.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracekit.device import cuda
from tracekit.errors import OutputError
from tracekit.outputs import check_output
from tracekit.record.device_alloc import SegmentLog, install_pool, pool_state, restore_pool
from tracekit.record.hook import EventBuffer, cupy_hook
from tracekit.record.meta import measure_budget, start_meta
from tracekit.record.recover import finalize
from tracekit.record.runner import check_target, default_output, run_target
from tracekit.record.sites import SiteTable, default_skip_dirs
from tracekit.record.spool import SpoolWriter, spool_path


def patch_threads(install: Callable[[], None]) -> Callable[[], None]:
    """Call ``install()`` at the start of every ``threading.Thread``; returns the undo function.

    ``Thread._bootstrap_inner`` runs in the new thread before ``run()``, also
    for subclasses that override ``run`` (patching ``run`` would miss them).
    """
    cls: Any = threading.Thread
    name = "_bootstrap_inner" if hasattr(cls, "_bootstrap_inner") else "run"
    original = getattr(cls, name)

    def bootstrap(self: threading.Thread) -> None:
        with contextlib.suppress(Exception):  # never let recording break the program's thread
            install()
        original(self)

    setattr(cls, name, bootstrap)
    return lambda: setattr(cls, name, original)


def import_cupy() -> Any:
    cupy = cuda.import_cupy("recording needs it")
    cuda.device_count(cupy.cuda.runtime)
    return cupy


class CupyRecording:
    """Records CuPy's default pool in this process from ``start()`` to ``stop()``."""

    def __init__(self, output: Path, *, command: list[str], sites: bool = True, limit: int | None = None,
                 interval: float = 0.5, max_events: int = 65536, force: bool = False) -> None:
        check_output(output, force=force)
        self.output, self.spool_path = output, spool_path(output)
        if self.spool_path.exists():
            raise OutputError(f"{self.spool_path}: a spool already exists (a recording still running, "
                              f"or one that was killed: `tracekit recover {self.spool_path}`)")
        self.command, self.sites_on, self.limit = command, sites, limit
        self.interval, self.max_events = interval, max_events

    def start(self) -> None:
        cupy = self.cupy = import_cupy()
        self.device_id = int(cupy.cuda.runtime.getDevice())
        budget = measure_budget(self.device_id)  # first: it reads NVML before our context exists
        self.buffer = EventBuffer()
        self.sites = SiteTable(default_skip_dirs()) if self.sites_on else None
        stream = cupy.cuda.get_current_stream
        rt = cupy.cuda.runtime
        self.segments = SegmentLog(self.buffer, device_malloc=rt.malloc, device_free=rt.free,
                                   current_stream=stream)
        self.pool, self._previous = install_pool(cupy, self.segments, self.limit)
        meta = start_meta(cupy, self.device_id, command=self.command, sites=self.sites_on,
                          limit=self.limit, pool=self.pool, budget=budget)
        self.t0 = time.perf_counter_ns()
        self.spool = SpoolWriter(self.spool_path, meta, self.buffer, self.sites, self.t0,
                                 interval=self.interval, max_events=self.max_events)
        pool = self.pool
        self.hook = cupy_hook(cupy, buffer=self.buffer, sites=self.sites, current_stream=stream,
                              pool_state=lambda device_id: pool_state(pool))
        self.spool.start()  # before patching: the flusher thread never allocates
        self.hook.__enter__()  # type: ignore[attr-defined]
        self._unpatch = patch_threads(self._install_here)

    def _install_here(self) -> None:
        self.hook.__enter__()  # type: ignore[attr-defined]

    def end_state(self) -> dict[str, dict[str, int]]:
        """The pool's own counters on every device it used (keys are device ids as strings)."""
        out = {}
        for d in sorted(self.segments.devices | {self.device_id}):
            with self.cupy.cuda.Device(d):
                out[str(d)] = pool_state(self.pool)
        return out

    def stop(self, exit_info: dict[str, Any] | None = None, *, restore: bool = False) -> Path:
        """Stop recording and write the trace; ``restore`` puts the previous default pool back.

        A CUDA error the program left behind can make reading the pool fail: it is
        stored as ``pool_end_error`` and the trace is still written; the spool is
        closed however ``stop`` ends, so a failed finalize leaves it recoverable.
        """
        end: dict[str, dict[str, int]] | None = None
        end_error: str | None = None
        try:
            self._unpatch()
            with contextlib.suppress(KeyError):
                self.hook.__exit__(None, None, None)  # type: ignore[attr-defined]
            try:
                end = self.end_state()
            except Exception as e:  # e.g. a sticky CUDA error from the program: keep its events
                end_error = f"{type(e).__name__}: {e}"
        finally:
            self.spool.close()
            self.segments.active = False
        extra: dict[str, Any] = {
            "complete": True, "exit": exit_info, "pool_end": end,
            "device_alloc_failures": self.segments.failures,
            "duration_ns": time.perf_counter_ns() - self.t0,
        }
        if end_error is not None:
            extra["pool_end_error"] = end_error
        if self.spool.error:
            extra["spool_error"] = self.spool.error
        if restore:
            restore_pool(self.cupy, self._previous)
        try:
            finalize(self.spool_path, self.output, extra)
        except Exception as e:
            raise OutputError(f"{self.output}: could not write the trace ({e}); the events are kept in "
                              f"{self.spool_path}: run `tracekit recover {self.spool_path}`") from None
        self.spool_path.unlink()
        return self.output


def record_cupy(target: list[str], *, module: bool = False, output: Path | None = None,
                limit: int | None = None, sites: bool = True, force: bool = False) -> tuple[Path, int]:
    """Run ``target`` like python would while recording CuPy's pool; returns (trace, exit code)."""
    check_target(target, module)
    out = output or default_output(target, module)
    command = ["python", "-m", *target] if module else ["python", *target]
    rec = CupyRecording(out, command=command, sites=sites, limit=limit, force=force)
    rec.start()
    outcome = run_target(target, module)
    try:
        path = rec.stop(outcome.to_dict())
    finally:
        outcome.keepalive = None
    return path, outcome.code
