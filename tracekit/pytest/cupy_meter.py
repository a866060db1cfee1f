"""One test's CuPy memory, measured in this process with the recorder's own pieces.

For the test's call only, ``CupyMeter`` registers the recorder's ``TraceHook`` (in the calling thread
and, through ``patch_threads``, every thread the test starts) with a ``PoolRegistry`` (CuPy's
default pool adopted as ``default``; the hook's alloc callbacks give the segment rows) and whole
call stacks (``LiveStacks``) into an ``EventBuffer`` with no writer: the rows stay in memory, no
spool, no watcher, no thread. At the end the peaks come from the rows: allocated from the malloc and
free rows (rounded sizes, as the pool's ``used_bytes`` counts them), reserved from the segment
rows (``total_bytes``), each on top of the pool's own counters at the start; the device's use from
the ``cudaMemGetInfo`` free bytes the segment rows carry. Only when a trace is wanted are the rows
written, through a ``SpoolWriter`` made then and ``recover.finalize``: the same trace ``tracekit
record`` writes.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

from tracekit.gpu import cuda
from tracekit.pytest.measure import Backend, DevicePeak, Measurement
from tracekit.record.callstacks import DEFAULT_DEPTH, live_stacks
from tracekit.record.device_alloc import pool_state
from tracekit.record.hook import (
    FREE,
    MALLOC,
    NOTE,
    SEGMENT_ALLOC,
    SEGMENT_FREE,
    EventBuffer,
    cupy_hook,
    unpack,
)
from tracekit.record.pools import PoolKind, PoolRegistry
from tracekit.record.probe import cupy_probe
from tracekit.record.session import oom_note, patch_threads
from tracekit.record.sites import SiteTable, default_skip_dirs, site_roots
from tracekit.trace.recorded import DEFAULT_POOL_LABEL


def import_cupy() -> tuple[Any, int]:
    """(cupy, device count), or DeviceError saying why not (not importable, no device)."""
    cupy = cuda.import_cupy("the GPU-memory budgets need CuPy or PyTorch")
    n = cuda.device_count(cupy.cuda.runtime)
    if n < 1:
        from tracekit.errors import DeviceError

        raise DeviceError("CuPy sees no CUDA device")
    return cupy, n


class CupyMeter:
    """Records one test's CuPy allocations in memory (``start`` … ``stop``)."""

    backend = Backend.CUPY

    def __init__(self, cupy: Any, n_devices: int, launcher: FrameType | None, *,
                 stack_depth: int = DEFAULT_DEPTH, free_cache: bool = True) -> None:
        self.cupy, self.n_devices, self.launcher = cupy, n_devices, launcher
        self.stack_depth, self.free_cache = stack_depth, free_cache
        self.rt = cupy.cuda.runtime
        self.roots = site_roots(None)

    def _each_device(self, fn: Any) -> dict[int, Any]:
        out = {}
        for d in range(self.n_devices):
            with self.cupy.cuda.Device(d):
                out[d] = fn(d)
        return out

    def start(self) -> None:
        cupy, rt = self.cupy, self.rt
        self.device_id = int(rt.getDevice())
        self.buffer = EventBuffer()
        self.sites = SiteTable(default_skip_dirs(), self.roots)
        self.stacks = live_stacks(self.sites, self.stack_depth, self.launcher)
        self.probe = cupy_probe(cupy)
        self.pools = PoolRegistry(cupy, self.buffer, sites=self.sites, oom_state=self._async_oom_state,
                                  stacks=self.stacks)
        self.pool = cupy.get_default_memory_pool()
        self.pools.adopt_default(self.pool)
        self.pools.pool_id(0, self.device_id)
        if self.free_cache:  # the cached free blocks of earlier tests are not this test's reserve
            self._each_device(lambda d: self.pool.free_all_blocks())
        self.base = self._each_device(lambda d: (int(self.pool.used_bytes()), int(self.pool.total_bytes()),
                                                 *(int(x) for x in rt.memGetInfo())))
        self.hook = cupy_hook(cupy, buffer=self.buffer, sites=self.sites, stacks=self.stacks,
                              current_stream=cupy.cuda.get_current_stream, oom_state=self._oom_state,
                              current_device=rt.getDevice if self.n_devices > 1 else None,
                              segments=self.pools.segments, sweep=self.pools.sweep)
        self.t0 = time.perf_counter_ns()
        self.hook.__enter__()  # type: ignore[attr-defined]
        self._unpatch = patch_threads(self._install_here)
        self.stopped = False

    def _install_here(self) -> None:
        self.hook.__enter__()  # type: ignore[attr-defined]

    def _oom_state(self, device: int) -> tuple[int, dict[str, Any]]:
        key, pool = self.pools.installed()
        if key is None:
            key, pool = 0, self.pool
        counters = pool_state(pool) if self.pools.kind(key) is PoolKind.POOL else None
        return self.pools.pool_id(key, device), self.probe.state(device, counters)

    def _async_oom_state(self, device: int, pool: Any, kind: PoolKind) -> dict[str, Any]:
        from tracekit.record.device_alloc import async_pool_state

        return self.probe.state(device, async_pool_state(pool))

    def stop(self) -> Measurement:
        """Unregister and measure (the rows stay, for ``write_trace``)."""
        if not self.stopped:
            self.stopped = True
            self.duration_ns = time.perf_counter_ns() - self.t0
            self._unpatch()
            with contextlib.suppress(KeyError):
                self.hook.__exit__(None, None, None)  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):  # the segments CuPy freed since the last row
                self.pools.sweep()
        return self.measure()

    def measure(self) -> Measurement:
        raw = self.buffer.peek()
        c = unpack(raw)
        op = c["op"]
        block = np.where(op == MALLOC, c["rounded"], np.where(op == FREE, -c["size"], 0))
        seg = np.where(op == SEGMENT_ALLOC, c["size"], np.where(op == SEGMENT_FREE, -c["size"], 0))
        events = op != NOTE
        peaks = {}
        for d, (used, total, free, dev_total) in self.base.items():
            m = events & (c["device"] == d)
            live = np.cumsum(block[m])
            held = np.cumsum(seg[m])
            k = int(np.argmax(live)) if len(live) else -1
            frees = c["device_free"][m]
            frees = frees[frees >= 0]
            low = min(free, int(frees.min())) if len(frees) else free
            peaks[d] = DevicePeak(
                device=d,
                allocated=used + max(0, int(live.max()) if len(live) else 0),
                reserved=total + max(0, int(held.max()) if len(held) else 0),
                device_used=dev_total - low,
                device_total=dev_total,
                leaked=int(live[-1]) if len(live) else 0,
                peak_index=k,
            )
        used = {d: p for d, p in peaks.items() if d == self.device_id or p.reserved or p.allocated}
        return Measurement(backend=self.backend, devices=used, events=int(events.sum()))

    def oom_text(self, exc: BaseException) -> str | None:
        """The hook's note of the out-of-memory error ``exc`` came from, as one paragraph."""
        note = oom_note(exc)
        notes = self.buffer.notes
        if note == "last":
            ooms = [n for n in notes.values() if n.get("kind") == "oom"]
            entry = ooms[-1] if ooms else None
        else:
            entry = notes.get(note) if isinstance(note, int) else None
        if entry is None:
            return None
        return oom_paragraph(entry)

    def write_trace(self, output: Path, *, nodeid: str, exception: BaseException | None) -> Path:
        """The test's trace at ``output`` (as ``tracekit record`` writes it); after ``stop``."""
        from tracekit.record.meta import start_meta
        from tracekit.record.recover import finalize
        from tracekit.record.session import exit_note
        from tracekit.record.sites import exception_site
        from tracekit.record.spool import SpoolWriter, spool_path

        output.parent.mkdir(parents=True, exist_ok=True)
        meta = start_meta(self.cupy, self.device_id, command=["pytest", nodeid], sites=True, limit=None,
                          pool=self.pool, budget="not measured (a test under pytest)",
                          stack_depth=self.stack_depth)
        meta = meta.with_extra(sites_relative_to=list(self.roots), pytest={"nodeid": nodeid})
        spool = spool_path(output)
        spool.unlink(missing_ok=True)
        output.unlink(missing_ok=True)
        writer = SpoolWriter(spool, meta, self.buffer, self.sites, self.t0, stacks=self.stacks)
        writer.close()  # writes every row the test left (no thread was started)
        exit_info = ({"status": "ok", "code": 0} if exception is None else
                     {"status": "exception", "code": 1, "exception": type(exception).__name__,
                      "message": str(exception)[:2000]})
        exit_meta = exit_note(exit_info, exception)
        exit_meta["site"] = exception_site(exception, default_skip_dirs(), self.roots)
        extra: dict[str, Any] = {
            "complete": True, "exit": exit_meta,
            "device_alloc_failures": sum(log.failures for log in self.pools.logs),
            "duration_ns": self.duration_ns, "device_mismatches": len(self.hook.mismatches),
        }
        try:
            extra["pool_end"], extra["pools"], extra["pools_end"] = _end_state(self.pools, self.device_id)
        except Exception as e:  # a sticky CUDA error the test left: the events are still kept
            extra["pool_end"], extra["pool_end_error"] = None, f"{type(e).__name__}: {e}"
        if writer.error:
            extra["spool_error"] = writer.error
        finalize(spool, output, extra)
        spool.unlink(missing_ok=True)
        return output


EndState = tuple[dict[str, dict[str, Any]], list[dict[str, Any]], list[dict[str, Any] | None]]


def _end_state(registry: PoolRegistry, device_id: int) -> EndState:
    """As ``CupyRecording.end_state``: the pools' counters summed per device, and the pools."""
    pools, ends = registry.metadata()
    keys = ("used_bytes", "total_bytes", "free_bytes", "n_free_blocks")
    zero = {**dict.fromkeys(keys, 0), "limit_bytes": None}
    out: dict[str, dict[str, Any]] = {str(device_id): dict(zero)}
    for entry, end in zip(pools, ends, strict=True):
        if entry["kind"] != PoolKind.POOL.value or not end or "error" in end:
            continue
        total = out.setdefault(str(entry["device"]), dict(zero))
        for k in keys:
            total[k] += int(end.get(k) or 0)
        if entry["label"] == DEFAULT_POOL_LABEL:
            total["limit_bytes"] = end.get("limit_bytes")
    for total in out.values():
        total["limit"] = total["limit_bytes"] or 0
    return out, pools, ends


def oom_paragraph(note: dict[str, Any]) -> str:
    """tracekit's OOM note (the request, the pool's counters, the device) as text."""
    from tracekit.units import format_size as fs

    state = note.get("state") or {}
    lines = [f"out of memory on device {note.get('device')}: a request of {fs(note.get('size'))} "
             f"(rounded to {fs(note.get('rounded'))})"]
    if note.get("total_bytes") is not None:
        limit = note.get("limit")
        lines.append(f"pool: {fs(note.get('used_bytes'))} in use of {fs(note.get('total_bytes'))} reserved, "
                     f"{fs(note.get('free_bytes'))} cached free in {note.get('n_free_blocks')} block(s)"
                     + (f", limit {fs(limit)}" if limit else ", no limit"))
    if state.get("mem_free") is not None:
        lines.append(f"device: {fs(state.get('mem_free'))} free of {fs(state.get('mem_total'))}")
    if state.get("error"):
        lines.append(f"device not measured: {state['error']}")
    return "\n".join(lines)
