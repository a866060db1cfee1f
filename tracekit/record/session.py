"""A CuPy recording: install the recorded pools and hook, run, read the pools, write the trace.

``CupyRecording.start`` measures the cheap budget (before this process
touches the device), replaces nothing of CuPy's (``tracekit.record.pools``; only
``--async-pools`` wraps CuPy's allocator functions), names CuPy's own default pool
``default``, keeps whole call stacks
(``tracekit.record.callstacks``, ``stack_depth`` frames each) unless
call-sites are off, writes the start metadata into the spool, starts its thread and registers the hook in the
calling thread and (through ``patch_threads``) in every ``threading.Thread``
started afterwards, since CuPy keeps its hook registry per thread. At an
out-of-memory error the hook measures the device (``tracekit.record.probe``).
``stop`` unregisters, reads every pool's own counters, flushes and finalizes
the spool into the trace (at the output, or beside it where the program made its own file there:
``tracekit.record.final``) and removes the spool. ``record_cupy`` wraps it
around ``runner.run_target`` with SIGTERM turned into an exception
(``tracekit.record.signals``): the program's exit code, exception or stop
signal pass through. The output and spool paths are absolute before the
program runs; a forked child of the program detaches (``os.register_at_fork``)
and only the process that started the recording writes the trace
(``runner.epilogue``), which loads the trace writer (and numba) only then.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from tracekit.errors import OutputError
from tracekit.gpu import cuda
from tracekit.interrupts import as_at_start
from tracekit.outputs import check_output
from tracekit.record.callstacks import DEFAULT_DEPTH, live_stacks
from tracekit.record.device_alloc import pool_state
from tracekit.record.final import Keep, write_final
from tracekit.record.hook import EventBuffer, cupy_hook
from tracekit.record.launch import Launch, output_path
from tracekit.record.meta import measure_budget, start_meta
from tracekit.record.pools import PoolKind, PoolRegistry
from tracekit.record.probe import cupy_probe
from tracekit.record.rmm import (
    RmmLogging,
    RmmLogs,
    RmmRows,
    local_time_of_day_ns,
    program_logs,
    read_rows,
    remove_ours,
    rmm_output,
    write_rmm_trace,
)
from tracekit.record.runner import Outcome, Recorded, check_target, default_output, epilogue, run_target
from tracekit.record.signals import restore_in_child, stop_signals
from tracekit.record.sites import SiteTable, default_skip_dirs, exception_site, site_roots
from tracekit.record.spool import SpoolWriter, spool_path
from tracekit.record.tail import Tail, tail_path
from tracekit.record.watch import GONE, Watcher
from tracekit.trace.recorded import DEFAULT_POOL_LABEL


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
    """Records every CuPy pool of this process from ``start()`` to ``stop()``."""

    def __init__(self, output: Path, *, command: list[str], sites: bool = True, limit: int | None = None,
                 interval: float = 0.5, max_events: int = 65536, force: bool = False,
                 launch: Launch | None = None, program: str | None = None,
                 stack_depth: int = DEFAULT_DEPTH, launcher: FrameType | None = None,
                 async_pools: bool = False, rmm: bool = False) -> None:
        output = Path(os.path.abspath(output))  # the program may change its working directory
        check_output(output, (program,), force=force)  # never the script being recorded
        self.output, self.spool_path = output, spool_path(output)
        self.keep = Keep.at_start(output, force)  # the one file at the output the trace may replace
        if self.spool_path.exists():
            raise OutputError(f"{self.spool_path}: a spool already exists (a recording still running, "
                              f"or one that was killed: `tracekit recover {self.spool_path}`)")
        self.command, self.sites_on, self.limit = command, sites, limit
        self.stack_depth = stack_depth if sites else 0  # --no-sites records no stacks either
        self.launcher = launcher  # the frame running the program: stacks stop there (callstacks.not_at)
        self.interval, self.max_events = interval, max_events
        self.async_pools = async_pools  # record --async-pools (tracekit.record.pools)
        self.launch = launch or Launch.from_env()
        self.roots = site_roots(program)
        self.watcher: Watcher | None = None  # started with the recording (tracekit.record.watch)
        self.tail: Tail | None = None  # the rows' shared ring (tracekit.record.tail)
        # record --rmm: RMM's own logging turned on for the program's resources (tracekit.record.rmm)
        self.rmm_logging = RmmLogging(Path(f"{self.spool_path}.rmm")) if rmm else None  # 3.12+

    def start(self) -> None:
        cupy = self.cupy = import_cupy()
        rt = cupy.cuda.runtime
        if self.rmm_logging is not None:  # first: a refusal leaves nothing started
            self.rmm_logging.devices = (rt.getDevice, rt.setDevice)
            self.rmm_logging.start()
        self.device_id = int(rt.getDevice())
        budget = measure_budget(self.device_id)  # first: it reads NVML before our context exists
        self.buffer = EventBuffer()
        # every row also into the spool's tail (a shared mapping): a death cannot take the last ones
        self.tail = Tail.open(tail_path(self.spool_path), 2 * self.max_events)
        if self.tail is not None:
            self.buffer.mirror(self.tail.ring)
        self.sites = SiteTable(default_skip_dirs(), self.roots) if self.sites_on else None
        self.stacks = (live_stacks(self.sites, self.stack_depth, self.launcher) if self.sites is not None
                       else None)
        self.probe = cupy_probe(cupy)
        self.pools = PoolRegistry(cupy, self.buffer, sites=self.sites, oom_state=self._async_oom_state,
                                  stacks=self.stacks)
        if self.async_pools:
            self.pools.patch()
        self.pool = cupy.get_default_memory_pool()  # CuPy's own, untouched (tracekit.record.pools)
        self.pools.adopt_default(self.pool)
        self.pools.pool_id(0, self.device_id)  # pool 0: the default pool on the starting device
        if self.limit:
            self.pool.set_limit(size=self.limit)
        meta = start_meta(cupy, self.device_id, command=self.command, sites=self.sites_on,
                          limit=self.limit, pool=self.pool, budget=budget, stack_depth=self.stack_depth)
        meta = meta.with_extra(launch=self.launch.to_dict(self.device_id), sites_relative_to=list(self.roots))
        self.t0 = time.perf_counter_ns()
        self.t0_of_day = local_time_of_day_ns(time.time_ns())  # RMM's logs' clock at t0
        self.start_meta = meta
        self.spool = SpoolWriter(self.spool_path, meta, self.buffer, self.sites, self.t0,
                                 interval=self.interval, max_events=self.max_events, stacks=self.stacks)
        several = cuda.device_count(rt) > 1
        self.hook = cupy_hook(cupy, buffer=self.buffer, sites=self.sites, stacks=self.stacks,
                              current_stream=cupy.cuda.get_current_stream, oom_state=self._oom_state,
                              current_device=rt.getDevice if several else None,
                              segments=self.pools.segments, sweep=self.pools.sweep)
        self.buffer.before_write = self.pools.sweep  # a segment CuPy freed ends by the next write
        self.pid = os.getpid()
        self.watcher = Watcher.start(self.spool_path, self.output, self.keep)  # finishes it however we end
        self.spool.start()  # before the program: the spool thread's allocator arena is made now
        self.hook.__enter__()  # type: ignore[attr-defined]
        self._unpatch = patch_threads(self._install_here)
        _RECORDING.append(self)

    def detach(self) -> None:
        """In a forked child (``os.register_at_fork``): record and write nothing more; the parent
        goes on recording, and only it writes the trace."""
        with contextlib.suppress(Exception):  # the forking thread's hook; other threads are gone
            self.hook.__exit__(None, None, None)  # type: ignore[attr-defined]
        self.pools.detach()
        if self.rmm_logging is not None:
            self.rmm_logging.detach(child=True)
        self.spool.detach()
        if self.tail is not None:
            self.tail.close()  # the parent's ring: this process's rows must not reach it
        if self.watcher is not None:
            self.watcher.close()  # the child's copy of the pipe must not keep the watcher waiting
        del self.buffer.rows[:]
        with contextlib.suppress(Exception):
            self._unpatch()
        restore_in_child()

    def _install_here(self) -> None:
        self.hook.__enter__()  # type: ignore[attr-defined]

    def _oom_state(self, device: int) -> tuple[int, dict[str, Any]]:
        """(pool id, measured state) at a MemoryPool's out-of-memory error on ``device`` (current)."""
        key, pool = self.pools.installed()
        if key is None:
            key, pool = 0, self.pool
        counters = pool_state(pool) if self.pools.kind(key) is PoolKind.POOL else None
        return self.pools.pool_id(key, device), self.probe.state(device, counters)

    def _async_oom_state(self, device: int, pool: Any, kind: PoolKind) -> dict[str, Any]:
        from tracekit.record.device_alloc import async_pool_state

        return self.probe.state(device, async_pool_state(pool))

    def end_state(self) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]],
                                 list[dict[str, Any] | None]]:
        """(``pool_end``, ``pools``, ``pools_end``) as the program left them.

        ``pool_end`` keys are device ids as strings: the counters summed over
        every ``MemoryPool`` on that device (the trace's live malloc and segment
        bytes of those pools equal ``used_bytes`` and ``total_bytes``), with the
        default pool's limit; async pools are only in ``pools_end``.
        """
        pools, ends = self.pools.metadata()
        keys = ("used_bytes", "total_bytes", "free_bytes", "n_free_blocks")
        zero = {**dict.fromkeys(keys, 0), "limit_bytes": None}
        out: dict[str, dict[str, Any]] = {str(self.device_id): dict(zero)}
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

    def stop(self, exit_info: dict[str, Any] | None = None, *,
             exception: BaseException | None = None) -> Path:
        """Stop recording and write the trace; returns where it went (the output, or the free name
        beside it where the program made its own file there).

        ``exception`` is the one the program ended with: if it came from a
        recorded out-of-memory error, ``exit.oom_seq`` names that OOM. A CUDA
        error the program left behind can make reading the pools fail: it is
        stored as ``pool_end_error`` and the trace is still written; the spool
        is closed however ``stop`` ends, so a failed finalize leaves it
        recoverable.
        """
        end: dict[str, dict[str, Any]] | None = None
        end_error: str | None = None
        pools: list[dict[str, Any]] | None = None
        pools_end: list[dict[str, Any] | None] | None = None
        if self in _RECORDING:
            _RECORDING.remove(self)
        rmm_logs = self.rmm_logging.stop() if self.rmm_logging is not None else program_logs()
        try:
            self._unpatch()
            with contextlib.suppress(KeyError):
                self.hook.__exit__(None, None, None)  # type: ignore[attr-defined]
            self.buffer.before_write = None
            with contextlib.suppress(Exception):  # the segments CuPy freed since the last write
                self.pools.sweep()
            try:
                end, pools, pools_end = self.end_state()
            except Exception as e:  # e.g. a sticky CUDA error from the program: keep its events
                end_error = f"{type(e).__name__}: {e}"
        finally:
            self.spool.close()
            if self.tail is not None:
                self.tail.close()  # the spool holds every row now
            self.pools.unpatch()
            self.probe.close()
        exit_meta = exit_note(exit_info, exception)
        exit_meta["site"] = exception_site(exception, default_skip_dirs(), self.roots)
        extra: dict[str, Any] = {
            "complete": True, "exit": exit_meta, "pool_end": end,
            "device_alloc_failures": sum(log.failures for log in self.pools.logs),
            "duration_ns": time.perf_counter_ns() - self.t0,
            "device_mismatches": len(self.hook.mismatches),
        }
        if pools is not None:
            extra["pools"], extra["pools_end"] = pools, pools_end
        if not self.async_pools and (self.pools.unrecorded_async or self.pools.async_seen(
                {self.device_id, *self.pools.segments.devices})):
            extra["async_pools_unrecorded"] = True  # record --async-pools would hold their rows
        if end_error is not None:
            extra["pool_end_error"] = end_error
        if self.spool.error:
            extra["spool_error"] = self.spool.error
        held = self.spool.held  # the program deleted or replaced its spool: the recorder's own file
        if held is not None:
            extra["spool_gone"] = GONE
        rmm_rows, rmm_only = self._rmm_rows(rmm_logs, extra)
        try:
            from tracekit.record.recover import finalize  # numba and the reader: after the program only

            source, head = held or self.spool_path, self.spool.head
            if rmm_rows is not None and rmm_only:
                rows = rmm_rows
                final = write_final(self.output, lambda path, more: write_rmm_trace(
                    path, rows, self.start_meta, {**extra, **more}), self.keep)
            else:
                final = write_final(self.output, lambda path, more: finalize(
                    source, path, {**extra, **more}, head=head), self.keep)
            if "rmm_logs_kept" not in extra:
                remove_ours(rmm_logs)  # their rows are in a trace
        except Exception as e:
            # This process may be what broke (a program that replaced json.dumps, a recursion limit
            # of 40): the watcher writes the trace from the spool in a clean process.
            done = self.watcher.finish() if self.watcher is not None else None
            if done is not None:
                return done
            raise OutputError(f"{self.output}: could not write the trace ({e}); the events are kept in "
                              f"{self.spool_path}: run `tracekit recover {self.spool_path}`") from None
        finally:
            self.spool.release()
        if held is None:  # a file the program put at the spool's name is its own
            self.spool_path.unlink(missing_ok=True)
        if self.tail is not None:
            self.tail.remove()
        if self.watcher is not None:
            self.watcher.done()
        return final

    def _rmm_rows(self, logs: RmmLogs, extra: dict[str, Any]) -> tuple[RmmRows | None, bool]:
        """RMM's rows of the run (``tracekit.record.rmm``), and whether they are the whole trace (the
        program allocated through RMM alone: its allocator in CuPy's place). Where CuPy's pools were
        used too, RMM's rows are written beside first, so the name ``extra`` gives is the real one."""
        rows = None
        if logs.unlogged and self.rmm_logging is None:
            extra["rmm_unlogged"] = sorted(logs.unlogged)  # record --rmm would log them
        if logs.files:
            try:
                rows = read_rows(logs, self.t0_of_day, by_recorder=self.rmm_logging is not None)
            except Exception as e:  # a log RMM left unreadable: kept, and the program's pools written
                extra["rmm_error"] = f"{type(e).__name__}: {e}"
                extra["rmm_logs_kept"] = [str(p) for p in logs.files]
        if rows is None or self.spool.events == 0:
            return rows, rows is not None
        beside = self._write_rmm_beside(rows, extra)
        if beside is not None:
            extra["rmm_trace"] = beside.name
        else:
            extra["rmm_logs_kept"] = [str(p) for p in logs.files]
        return rows, False

    def _write_rmm_beside(self, rows: RmmRows, extra: dict[str, Any]) -> Path | None:
        """RMM's rows as their own trace beside the one of CuPy's pools (``out.rmm.parquet``, or the
        first free name beside that); where it went, None where it could not be written (said)."""
        from tracekit.record.runner import tell

        try:
            return write_final(rmm_output(self.output), lambda path, more: write_rmm_trace(
                path, rows, self.start_meta, {**extra, **more}))
        except Exception as e:
            tell(f"tracekit: error: {rmm_output(self.output)}: could not write RMM's allocations "
                 f"({type(e).__name__}: {e}); RMM's logs are kept")
            return None


def exit_note(info: dict[str, Any] | None, exception: BaseException | None) -> dict[str, Any]:
    """The ``exit`` object, with ``oom_note``: the hook's note index carried by the final exception."""
    out = dict(info or {"status": "ok", "code": 0})
    out.setdefault("status", "ok")
    for key in ("exception", "signal", "message"):
        out.setdefault(key, None)
    out["oom_note"] = oom_note(exception)
    return out


def oom_note(exception: BaseException | None) -> int | str | None:
    """The note index an out-of-memory error carries (through its cause/context chain), else
    ``"last"`` for a MemoryError without one, else None."""
    seen = set()
    e = exception
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        note = getattr(e, "_tracekit_oom_note", None)
        if note is not None:
            return int(note)
        e = e.__cause__ or e.__context__
    return "last" if isinstance(exception, MemoryError) else None


def record_cupy(target: list[str], *, module: bool = False, output: Path | None = None,
                limit: int | None = None, sites: bool = True, force: bool = False,
                stack_depth: int = DEFAULT_DEPTH, async_pools: bool = False, rmm: bool = False) -> Recorded:
    """Run ``target`` like python would while recording CuPy's pools; returns what was recorded.

    ``output`` may hold ``{rank}``-style placeholders (``tracekit.record.launch``); it and the
    spool are made absolute first, so a program that changes its working directory keeps them.
    """
    check_target(target, module)
    launch = Launch.from_env()
    out = Path(os.path.abspath(output_path(output or default_output(target, module), launch)))
    command = ["python", "-m", *target] if module else ["python", *target]
    rec = CupyRecording(out, command=command, sites=sites, limit=limit, force=force, launch=launch,
                        program=None if module else target[0], stack_depth=stack_depth,
                        launcher=sys._getframe(), async_pools=async_pools, rmm=rmm)
    # SIGTERM: with the watcher running, the program keeps the signal's own disposition (a death by
    # SIGTERM stays one, and a program that catches every exception, as pytest does, cannot swallow
    # it); the watcher then writes the trace from the spool and its tail, every row included.
    # Without a watcher (no pidfd_open) SIGTERM raises Terminated, so the trace is still written.
    with stop_signals():
        rec.start()
        guarded = rec.watcher is None
        if guarded:
            outcome = run_target(target, module)
    if not guarded:
        with as_at_start():
            outcome = run_target(target, module)
    return epilogue(rec.pid, outcome, lambda: rec.stop(outcome.to_dict(), exception=_exception(outcome)),
                    output=out)


def _exception(outcome: Outcome) -> BaseException | None:
    return outcome.keepalive if isinstance(outcome.keepalive, BaseException) else None


_RECORDING: list[CupyRecording] = []  # the recording of this process, detached in a forked child


def _after_fork_in_child() -> None:
    for rec in _RECORDING:
        rec.detach()
    _RECORDING.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
