"""A program's RMM allocations, recorded through RMM's own logging.

RMM (``rmm``, the RAPIDS Memory Manager) can back CuPy (``cupy.cuda.set_allocator(rmm_cupy_allocator)``)
and PyTorch (``rmm.allocators.torch``); its allocations then pass no CuPy pool and no PyTorch caching
allocator, so neither recorder sees them. RMM logs every call itself: ``rmm.reinitialize(logging=True,
log_file_name=F)`` or ``rmm.mr.enable_logging(F)`` put a ``LoggingResourceAdaptor`` over each device's
resource, which writes ``allocate``/``free``/``allocate failure`` lines to ``F`` with ``.dev<N>``
before its extension (the CSV ``tracekit import rmm`` reads).

- **Always**: where the program turned RMM's logging on itself, the recording flushes those logs at
  its end (``LoggingResourceAdaptor.flush``) and their rows become the trace (the files stay as the
  program left them).
- **``record --rmm``** turns RMM's logging on for every resource the program sets, by RMM's own
  ``rmm.mr.enable_logging``, into files beside the spool (removed once they are in the trace): right
  after ``rmm.reinitialize`` returns and right after ``rmm.mr.set_current_device_resource`` or
  ``set_per_device_resource`` returns. Nothing of RMM's is replaced: the calls are seen through
  ``sys.monitoring`` (Python 3.12+), a ``CALL`` event at each call site of the program that is
  switched off (``DISABLE``) at its first call unless it called one of those functions, so the cost
  after that is nil. What the program sees change is what ``enable_logging`` changes:
  ``rmm.mr.get_current_device_resource()`` returns the logging adaptor, whose ``get_upstream()`` is
  the program's resource. A resource the program builds over one that logs already (a statistics
  adaptor over the current resource) is not logged again. Allocations made before the first
  resource was set, and buffers still held from a replaced resource, are freed through the resource
  that made them, unlogged.

Times: RMM logs the local time of day to the microsecond; the rows are put on the recording's clock
(ns since its start) and the files of several devices or resources merged by time, each file's own
order kept. A recorded program's rows and RMM's go to separate traces where both exist
(``session.CupyRecording.stop``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType
from typing import Any, TypedDict

import numpy as np

from tracekit.errors import UsageError

TOOL_IDS = (3, 4)  # sys.monitoring's ids left free by the standard debugger/coverage/profiler/optimizer
TOOL_NAME = "tracekit-rmm"
DAY_NS = 86_400 * 10**9


class RmmPoolJSON(TypedDict):
    """``rmm_record.pool``: the program's RMM pool, as it set it up (the last one it set)."""

    initial_pool_size: int | str | None  # rmm.reinitialize's argument as given (None: RMM's default)
    maximum_pool_size: int | str | None  # likewise (None: no maximum)
    initial_bytes: int | None  # PoolMemoryResource.pool_size() when logging started: the initial pool
    maximum_bytes: int | None  # maximum_pool_size in bytes, where it was given


class RmmRecordJSON(TypedDict):
    """The ``rmm_record`` metadata key of a trace made from RMM's logs by ``record``."""

    logs: list[str]  # the log files read, in the order their rows were merged
    logging: str  # "program": the program's own logging; "record --rmm": turned on by the recorder
    rows: int  # log lines read
    null_pointer_rows: int  # allocate/free lines with a null pointer (0-byte requests): no row
    null_allocations: int  # of those, the allocate lines (RMM answers a 0-byte request with nullptr)
    enable_errors: list[str]  # why enable_logging failed, where it did (one sentence each)
    time: str  # what t_ns is made of
    pool: RmmPoolJSON | None  # the pool the program set up (record --rmm), None where none was seen


def local_time_of_day_ns(wall_ns: int) -> int:
    """Nanoseconds since local midnight at ``wall_ns`` (ns since the epoch): the clock RMM logs by."""
    t = time.localtime(wall_ns // 10**9)
    return ((t.tm_hour * 60 + t.tm_min) * 60 + t.tm_sec) * 10**9 + wall_ns % 10**9


@dataclass
class RmmLogs:
    """The RMM logs a recording takes its rows from, and how they came to be."""

    files: list[Path] = field(default_factory=list)  # in order of first sight
    devices: dict[Path, int] = field(default_factory=dict)  # the device each file logs
    ours: set[Path] = field(default_factory=set)  # the ones ``record --rmm`` made (removed after)
    enable_errors: list[str] = field(default_factory=list)
    unlogged: set[int] = field(default_factory=set)  # devices whose RMM resource logs nothing
    pool: RmmPoolJSON | None = None  # the pool the program set up last (record --rmm)

    def add(self, name: object, device: int | None = None) -> Path | None:
        if not isinstance(name, str) or not name:
            return None
        path = Path(name)
        if path not in self.files:
            self.files.append(path)
        if device is not None:
            self.devices.setdefault(path, int(device))
        return path


def _monitoring() -> Any:
    """``sys.monitoring`` (Python 3.12+), None before."""
    return getattr(sys, "monitoring", None)


def _rmm() -> Any:
    """The program's ``rmm`` module, None where it never imported it (the recorder never does)."""
    return sys.modules.get("rmm")


def flush_logs(logs: RmmLogs) -> None:
    """Flush every ``LoggingResourceAdaptor`` in each device resource's chain and note its file (an
    adaptor the program put over a logging one hides it from ``get_log_filenames``)."""
    rmm = _rmm()
    if rmm is None:
        return
    with contextlib.suppress(Exception):  # an RMM that broke must not break the program's end
        mr = rmm.mr
        for device in list(mr.get_log_filenames()):
            found = False
            for adaptor in _logs_in_chain(mr, mr.get_per_device_resource(device)):
                found = True
                logs.add(str(adaptor.get_file_name()), device)
                with contextlib.suppress(Exception):
                    adaptor.flush()
            if not found:
                logs.unlogged.add(int(device))


class RmmLogging:
    """``record --rmm``: RMM's logging turned on for every resource the program sets (module doc).

    ``devices``: (get the current device, set it): a ``LoggingResourceAdaptor`` is made with its
    device current, as ``set_per_device_resource`` requires and as its file name (``.dev<N>``) says.
    """

    def __init__(self, base: Path, devices: tuple[Callable[[], int], Callable[[int], None]] | None = None
                 ) -> None:
        if _monitoring() is None:
            raise UsageError("record --rmm needs Python 3.12 or later (it sees RMM's calls through "
                             "sys.monitoring)")
        self.base = base  # our logs: base.<k>.csv, RMM adding .dev<N>
        self.devices = devices
        self.logs = RmmLogs()
        self.tool: int | None = None
        self._made = 0
        self._pool_id = 0
        self._armed = False  # the program's rmm seen imported: its resource logged from then on
        self._arguments: tuple[int | str | None, int | str | None] = (None, None)  # reinitialize's
        self._lock = threading.Lock()  # one _enable at a time (threads setting resources at once)
        self._inside = threading.local()  # our own RMM calls in _enable fire events too: not watched

    def start(self) -> None:
        mon = _monitoring()
        tool = next((i for i in TOOL_IDS if mon.get_tool(i) is None), None)
        if tool is None:
            raise UsageError(f"record --rmm: sys.monitoring's tool ids {TOOL_IDS} are both in use in "
                             "this process")
        mon.use_tool_id(tool, TOOL_NAME)
        self.tool = tool
        ev = mon.events
        mon.register_callback(tool, ev.CALL, self._call)
        mon.register_callback(tool, ev.C_RETURN, self._c_return)
        mon.set_events(tool, ev.CALL)  # C_RETURN comes with CALL, where CALL stays on
        os.register_at_fork(before=self._before_fork)

    def stop(self) -> RmmLogs:
        """Stop watching; flush every log; the logs to read."""
        self.detach()
        flush_logs(self.logs)
        return self.logs

    def detach(self, child: bool = False) -> None:
        """Stop watching; in a forked ``child`` also take our adaptors off, so its allocations do not
        go into the parent's logs (buffers it frees that came through them still do)."""
        if child:
            with contextlib.suppress(Exception):
                rmm = _rmm()
                if rmm is not None:
                    self._unwrap(rmm)
        if self.tool is not None:
            mon = _monitoring()
            with contextlib.suppress(Exception):
                mon.set_events(self.tool, 0)
                for event in (mon.events.CALL, mon.events.C_RETURN):
                    mon.register_callback(self.tool, event, None)
                mon.free_tool_id(self.tool)
            self.tool = None

    def _before_fork(self) -> None:
        # a child copies the log's unwritten buffer: flushed first, it cannot write those lines again
        if self.tool is not None:
            flush_logs(self.logs)

    # -- the events -------------------------------------------------------------------------------
    # A site is watched (CALL left on, so its C_RETURN comes) where it lies in ``rmm.reinitialize``'s
    # own code (its call of RMM's initializer sets the new resources, however reinitialize itself was
    # called, ``**kwargs`` included) or calls a setter; every other site is switched off at its first
    # call.

    def _watched(self, rmm: Any, code: CodeType, callable_: object) -> bool:
        if code is getattr(getattr(rmm, "reinitialize", None), "__code__", None):
            return True
        mr = rmm.mr
        return any(callable_ is f for f in (mr.set_current_device_resource, mr.set_per_device_resource,
                                             mr.enable_logging, mr.disable_logging))

    def _call(self, code: CodeType, offset: int, callable_: object, arg0: object) -> object:
        if getattr(self._inside, "on", False):
            return None
        rmm = _rmm()
        try:
            if rmm is not None and not self._armed and hasattr(rmm, "reinitialize"):
                self._armed = True  # rmm is imported whole: log the resource RMM would use now
                self._enable(default=True)
            if rmm is not None and self._watched(rmm, code, callable_):
                if code is getattr(rmm.reinitialize, "__code__", None):
                    self._arguments = _pool_arguments(sys._getframe(1))  # reinitialize's own frame
                flush_logs(self.logs)  # a resource about to be replaced: its lines so far
                if callable_ is rmm.mr.enable_logging:
                    self._unwrap(rmm)  # the program's own logging goes over its resource, not ours
                return None
        except Exception:  # an RMM without these names, or one half imported: nothing to watch here
            pass
        return _monitoring().DISABLE

    def _c_return(self, code: CodeType, offset: int, callable_: object, arg0: object) -> object:
        if getattr(self._inside, "on", False):
            return None
        rmm = _rmm()
        with contextlib.suppress(Exception):
            if rmm is not None and self._watched(rmm, code, callable_):
                self._enable()
        return None

    def _unwrap(self, rmm: Any) -> None:
        """Put back the program's resource under each of our adaptors on top (its rows so far stay)."""
        self._inside.on = True
        try:
            mr = rmm.mr
            for device, name in mr.get_log_filenames().items():
                if name is not None and Path(name) in self.logs.ours:
                    mr.set_per_device_resource(device, mr.get_per_device_resource(device).get_upstream())
        finally:
            self._inside.on = False

    def _enable(self, default: bool = False) -> None:
        """Log every device resource the program set that logs nowhere in its chain yet; with
        ``default``, where the program set none, the one RMM makes at the first allocation on the
        current device (``get_per_device_resource``: a ``CudaMemoryResource``, as RMM would make).

        A resource the program built over one already logging (``StatisticsResourceAdaptor(
        get_current_device_resource())`` after we logged the pool) passes its calls through that log:
        wrapping it again would log each call twice."""
        rmm = _rmm()
        if rmm is None:
            return
        self._inside.on = True
        try:
            with self._lock:
                mr = rmm.mr
                devices = list(mr.get_log_filenames())  # {} before the program set any resource
                if not devices and default and self.devices is not None:
                    devices = [self.devices[0]()]
                for device in devices:
                    top = mr.get_per_device_resource(device)
                    self._note_pool(mr, top)
                    logged = _log_in_chain(mr, top)
                    if logged is not None:
                        self.logs.add(logged, device)
                        continue
                    base = f"{self.base}.{self._made}.csv"
                    self._made += 1
                    adaptor = self._adaptor(mr, top, base, int(device))
                    mr.set_per_device_resource(device, adaptor)  # what rmm.mr.enable_logging does
                    name = self.logs.add(str(adaptor.get_file_name()), device)
                    if name is not None:
                        self.logs.ours.add(name)
        except Exception as e:
            if len(self.logs.enable_errors) < 8:
                self.logs.enable_errors.append(f"{type(e).__name__}: {str(e)[:200]}")
        finally:
            self._inside.on = False

    def _note_pool(self, mr: Any, resource: Any) -> None:
        """The pool in ``resource``'s chain, as the program set it up: its size now (before any
        allocation of it: the initial pool) and reinitialize's arguments (a pool set directly has
        none we can read)."""
        pool = next((r for r in _chain(resource) if isinstance(r, mr.PoolMemoryResource)), None)
        if pool is None or (self.logs.pool is not None and self._pool_id == id(pool)):
            return
        self._pool_id = id(pool)
        initial, maximum = self._arguments
        self._arguments = (None, None)
        self.logs.pool = RmmPoolJSON(initial_pool_size=initial, maximum_pool_size=maximum,
                                     initial_bytes=int(pool.pool_size()), maximum_bytes=_bytes(maximum))

    def _adaptor(self, mr: Any, upstream: Any, base: str, device: int) -> Any:
        if self.devices is None:
            return mr.LoggingResourceAdaptor(upstream, log_file_name=base)
        get, put = self.devices
        was = get()
        if was == device:
            return mr.LoggingResourceAdaptor(upstream, log_file_name=base)
        put(device)
        try:
            return mr.LoggingResourceAdaptor(upstream, log_file_name=base)
        finally:
            put(was)


def _chain(resource: Any, depth: int = 16) -> list[Any]:
    """``resource`` and its upstreams (``get_upstream()``), top first."""
    out = []
    for _ in range(depth):
        out.append(resource)
        upstream = getattr(resource, "get_upstream", None)
        if upstream is None:
            break
        resource = upstream()
    return out


def _logs_in_chain(mr: Any, resource: Any) -> list[Any]:
    """The ``LoggingResourceAdaptor``s in ``resource``'s chain of upstreams, top first."""
    return [r for r in _chain(resource) if isinstance(r, mr.LoggingResourceAdaptor)]


def _json_size(v: object) -> int | str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    return str(v)[:64] if isinstance(v, str) else None


def _pool_arguments(frame: Any) -> tuple[int | str | None, int | str | None]:
    """``initial_pool_size`` and ``maximum_pool_size`` of a running ``rmm.reinitialize`` (its frame's
    locals, read only), where it sets up a pool; (None, None) otherwise."""
    try:
        local = frame.f_locals
        if not local.get("pool_allocator"):
            return None, None
        return _json_size(local.get("initial_pool_size")), _json_size(local.get("maximum_pool_size"))
    except Exception:
        return None, None


def _bytes(v: int | str | None) -> int | None:
    """A size as RMM's ``parse_bytes`` would read it (``1GiB``, ``512MB``, an int), None otherwise."""
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, str):
        from tracekit.units import parse_size

        try:
            return parse_size(v.replace(" ", ""), "maximum_pool_size")
        except Exception:
            return None
    return None


def _log_in_chain(mr: Any, resource: Any) -> str | None:
    """The file of the first ``LoggingResourceAdaptor`` in ``resource``'s chain of upstreams."""
    found = _logs_in_chain(mr, resource)
    return str(found[0].get_file_name()) if found else None


def program_logs() -> RmmLogs:
    """Without ``--rmm``: the logs the program's own RMM resources write now, flushed."""
    logs = RmmLogs()
    flush_logs(logs)
    return logs


@dataclass(frozen=True, eq=False)
class RmmRows:
    """The rows of a recording's RMM logs on its clock, merged."""

    events: Any  # tracekit.trace.Events
    thread: np.ndarray  # uint64, the OS thread of each row
    info: RmmRecordJSON


def _on_clock(t_day: np.ndarray, start: int) -> np.ndarray:
    """A file's times of day (ns) as ns since the recording's start (``start``, a time of day): a
    step back of more than 12 hours is a midnight passed (any number of them), a first row more than
    12 hours before the start is one on the next day; then non-decreasing (each file's order kept)."""
    if len(t_day) == 0:
        return t_day.astype(np.int64)
    days = np.concatenate(([0], np.cumsum(np.diff(t_day) < -DAY_NS // 2, dtype=np.int64)))
    t = t_day.astype(np.int64) + days * DAY_NS - start
    if t[0] < -DAY_NS // 2:
        t += DAY_NS
    return np.maximum.accumulate(np.maximum(t, 0))


def read_rows(logs: RmmLogs, start_time_of_day_ns: int, *, by_recorder: bool) -> RmmRows | None:
    """Every row of ``logs`` (the files that exist) on the recording's clock (ns since its start,
    whose local time of day was ``start_time_of_day_ns``), merged by time; None without a row file."""
    from tracekit.importers.rmm_log import Action, device_of, log_events, read_log
    from tracekit.trace import Events

    parts, threads = [], []
    names: list[str] = []
    rows = nulls = null_allocations = 0
    for path in (p for p in logs.files if p.is_file()):
        cols = read_log(path)
        t = _on_clock(cols.t_ns, start_time_of_day_ns)
        device = logs.devices.get(path, device_of(path) or 0)
        ev, thread, _ = log_events(cols, device, t)
        rows += len(cols.action)
        nulls += len(cols.action) - len(ev)
        null_allocations += int(np.count_nonzero((cols.pointer == 0) & (cols.action == Action.ALLOCATE)))
        parts.append(ev)
        threads.append(thread)
        names.append(path.name)
    if not names:
        return None
    t_all = np.concatenate([e.t_ns for e in parts])
    pick = np.argsort(t_all, kind="stable")  # files concatenated in order: ties keep each file's order
    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(e, name) for e in parts])[pick]

    events = Events.build(cat("op"), cat("size"), addr=cat("addr"), rounded=cat("rounded"),
                          t_ns=cat("t_ns"), stream=cat("stream"), device=cat("device"))
    info = RmmRecordJSON(
        logs=names, logging="record --rmm" if by_recorder else "program", rows=rows,
        null_pointer_rows=nulls, null_allocations=null_allocations, enable_errors=list(logs.enable_errors),
        time="ns since the recording started: RMM's local time of day to the microsecond, on its clock",
        pool=logs.pool,
    )
    return RmmRows(events, np.concatenate(threads)[pick], info)


# the start metadata's keys that hold for RMM's rows too (the rest describe CuPy's pools)
KEPT_START_KEYS = ("argv", "rerun", "device_id", "device_count", "nvml", "device_limits", "budget", "launch")
# the end keys likewise
KEPT_END_KEYS = ("complete", "duration_ns", "output_taken", "spool_gone")


def write_rmm_trace(path: Path, rows: RmmRows, start: Any, end: dict[str, Any]) -> Path:
    """Write ``rows`` as an RMM trace at ``path`` with the recording's metadata (``start``: its
    TraceMeta at the start; ``end``: the keys ``stop`` gathered, ``exit`` with its ``oom_note``)."""
    from dataclasses import replace

    import pyarrow as pa

    from tracekit.trace import Op, Source, write_trace

    extra = {k: v for k, v in start.extra.items() if k in KEPT_START_KEYS}
    extra.update({k: v for k, v in end.items() if k in KEPT_END_KEYS})
    exit_info = dict(end.get("exit") or {})
    note = exit_info.pop("oom_note", None)
    ooms = np.flatnonzero(rows.events.op == Op.OOM)
    # the program ended by an out-of-memory error and RMM logged a failure: the last one is why
    # ("last": a MemoryError without the CuPy hook's mark, which RMM raises; an int is a CuPy pool's)
    exit_info["oom_seq"] = int(rows.events.seq[ooms[-1]]) if note == "last" and len(ooms) else None
    extra["exit"] = exit_info
    extra["rmm_record"] = dict(rows.info)
    extra["recorder"] = {"call_sites": False, "stack_depth": 0,
                         "hook": "RMM's own logging_resource_adaptor (rmm.mr.enable_logging)"}
    versions = dict(start.versions)
    rmm = _rmm()
    if rmm is not None:
        versions["rmm"] = str(getattr(rmm, "__version__", "?"))
    pool = rows.info["pool"]
    limit = pool["maximum_bytes"] if pool is not None else None  # RMM's maximum_pool_size: the pool's limit
    meta = replace(start, source=Source.RMM, pool_limit_bytes=limit, versions=versions, extra=extra)
    return write_trace(path, meta, rows.events, {"thread": pa.array(rows.thread, pa.uint64())})


def rmm_output(output: Path) -> Path:
    """Where RMM's rows go beside a trace of the program's own pools: ``out.rmm.parquet``."""
    name = output.name
    base = name[: -len(".parquet")] if name.endswith(".parquet") and name != ".parquet" else name
    return output.with_name(base + ".rmm.parquet")


def remove_ours(logs: RmmLogs) -> None:
    for path in logs.ours:
        with contextlib.suppress(OSError):
            path.unlink()
