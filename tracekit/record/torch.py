"""``record --torch``: run a PyTorch program unmodified with its memory history on, then import it.

Before the program starts, PyTorch's allocation history is turned on
(``_record_memory_history(enabled="all", context="all", stacks="python",
max_entries=MAX_ENTRIES)``; ``TRACEKIT_TORCH_MAX_ENTRIES`` overrides the ring
buffer's length) and an out-of-memory observer is attached
(``torch._C._cuda_attach_out_of_memory_observer``; PyTorch calls it after
releasing the allocator's lock, before it raises). At every OOM the observer
measures the device (``tracekit.record.probe``: ``cudaMemGetInfo``, NVML's
per-process memory, the runtime limits, the allocator's allocated and
reserved bytes and its limit) and, at most every ``DUMP_EVERY_S`` seconds,
dumps the snapshot (atomically, beside the trace as ``TRACE.pickle``), so a
process that dies after an OOM still leaves one. The snapshot is dumped again
when the program ends, however it ends (normal exit, ``sys.exit``, an
uncaught exception, Ctrl-C, a launcher's SIGTERM), and imported into the
trace, which gets the version-2 keys: ``oom_states`` (the k-th measured OOM
is the k-th ``oom`` row, counted from the end when the history wrapped),
``exit`` (``oom_seq`` is the last OOM when the program died of an
out-of-memory error), ``pools`` (PyTorch's caching allocator on each device),
``launch`` and the ``pool`` column. Every row keeps its whole Python stack
(``importers.torch_stacks``). Call-sites and the stacks' files are made
relative to the working directory or the program's folder. PyTorch is
imported only here.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time
from pathlib import Path
from typing import Any

from tracekit.errors import DeviceError, OutputError, UsageError
from tracekit.record.final import Keep
from tracekit.record.runner import Recorded, tell
from tracekit.record.torch_trace import TorchEnd, write_torch_trace

MAX_ENTRIES = 1_000_000
DUMP_EVERY_S = 2.0  # at most one snapshot dump per this many seconds from the OOM observer


def snapshot_path(trace: Path) -> Path:
    """Where the raw snapshot goes: beside the trace, ``TRACE.pickle`` (PyTorch's viewer reads it)."""
    return trace.with_name(trace.name.removesuffix(".parquet") + ".pickle")


def record_torch(target: list[str], *, module: bool, output: Path | None,
                 force: bool = False, limit: int | None = None) -> Recorded:
    """Run ``target`` like ``python [-m] target...``; returns the trace and the program's exit code.

    ``limit`` (bytes) caps the caching allocator on the current device before the program starts
    (``set_per_process_memory_fraction(limit / total)``), as ``record --limit`` caps CuPy's pool.

    The trace and snapshot paths are made absolute before the program runs (it may ``chdir``).
    """
    from tracekit.outputs import check_output
    from tracekit.record.launch import Launch, output_path
    from tracekit.record.runner import check_target, default_output, epilogue, run_target
    from tracekit.record.signals import stop_signals

    check_target(target, module)
    launch = Launch.from_env()
    given = Path(output) if output is not None else default_output(target, module)
    out = Path(os.path.abspath(output_path(given, launch)))
    script = None if module else target[0]  # never overwritten, whatever -o names
    check_output(out, (script,), force=force)
    check_output(snapshot_path(out), (script,), force=force)  # the snapshot is written beside the trace
    keep = Keep.at_start(out, force)  # the one file at the output the trace may replace
    entries = max_entries()
    torch = _torch()
    command = ["python", "-m", *target] if module else ["python", *target]
    rec = _Recording(torch, snapshot_path(out), command, entries)
    if limit is not None:
        total = int(rec.info["total_bytes"])
        if limit > total:
            raise UsageError(f"--limit {limit}: more than the device's {total} bytes")
        torch.cuda.set_per_process_memory_fraction(limit / total, rec.device)
    rec.rerun = {"argv": list(target), "module": module, "cwd": os.getcwd(), "limit_bytes": limit}
    roots = _roots(script)
    watcher = rec.start_ring(out, launch.to_dict(rec.device), roots, keep)  # before the first event
    with stop_signals():
        rec.start()
        outcome = run_target(target, module)

    def finish() -> Path:
        snap = rec.stop(outcome.code)
        final = outcome.keepalive if isinstance(outcome.keepalive, BaseException) else None
        exit_info = {**outcome.to_dict(), "oom_seq": None, "died_of_oom": _is_oom(torch, final),
                     "site": _exception_site(torch, final, roots)}
        outcome.keepalive = None
        try:
            path = write_torch_trace(snap, rec.end(), out, exit_info, launch.to_dict(rec.device), roots, keep,
                                     rec.ring_meta())
        except Exception:
            # This process may be what broke (json.dumps replaced, a recursion limit of 40): the
            # watcher writes the trace from the tracker's ring in a clean process.
            done = watcher.finish() if watcher is not None else None
            if done is None:
                raise
            rec.remove_ring()
            return done
        rec.remove_ring()
        if watcher is not None:
            watcher.done()
        return path

    return epilogue(rec.pid, outcome, finish, output=out)


def _roots(script: str | None) -> tuple[str, ...]:
    from tracekit.record.sites import site_roots

    return site_roots(script)


def _exception_site(torch: Any, exc: BaseException | None, roots: tuple[str, ...]) -> str | None:
    """The innermost frame of the program's exception outside PyTorch and tracekit (None if none)."""
    from tracekit.record.sites import exception_site

    tracekit_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return exception_site(exc, (tracekit_dir, os.path.dirname(os.path.abspath(torch.__file__))), roots)


def _is_oom(torch: Any, e: BaseException | None) -> bool:
    """Whether the program's final exception is (or was caused by) an out-of-memory error."""
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", MemoryError)
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, oom | MemoryError):
            return True
        e = e.__cause__ or e.__context__
    return False


def max_entries() -> int:
    """The history ring buffer's length: ``TRACEKIT_TORCH_MAX_ENTRIES`` or ``MAX_ENTRIES``."""
    text = os.environ.get("TRACEKIT_TORCH_MAX_ENTRIES")
    if text is None:
        return MAX_ENTRIES
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n <= 0:
        raise UsageError(f"TRACEKIT_TORCH_MAX_ENTRIES={text!r} is not a positive whole number of entries")
    return n


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:
        raise DeviceError(f"record --torch needs PyTorch, which cannot be imported ({e})") from None
    if not torch.cuda.is_available():
        raise DeviceError("record --torch needs a CUDA device, and PyTorch sees none")
    return torch


class _Recording:
    """History on, OOM observer attached; ``stop`` dumps the final snapshot and turns history off."""

    def __init__(self, torch: Any, path: Path, command: list[str], entries: int = MAX_ENTRIES) -> None:
        self.torch, self.path = torch, path
        self.device = int(torch.cuda.current_device())
        free, total = torch.cuda.mem_get_info()
        self.info: dict[str, Any] = {
            "command": " ".join(command), "max_entries": entries,
            "torch_version": str(torch.__version__), "cuda_version": str(torch.version.cuda),
            "device_name": str(torch.cuda.get_device_name()), "total_bytes": int(total),
            "free_bytes_at_start": int(free),
            "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }
        self.states: list[dict[str, Any]] = []  # the device measured at each OOM, in order
        self.rerun: dict[str, Any] = {}  # how to run the program again (``advise --rerun``)
        self._last_dump = 0.0
        self.pid = os.getpid()  # only this process writes the snapshot and the trace
        self.ring: Any = None  # torch_ring.TorchRing, where the tracker could be attached
        self.ring_note: str | None = None  # why not, where it could not
        self._trace: Path | None = None

    def start_ring(self, trace: Path, launch: dict[str, Any], roots: tuple[str, ...],
                   keep: Keep | None) -> Any:
        """Build (once per PyTorch) and attach the tracker, write the head the watcher reads and
        start the watcher (``tracekit.record.torch_ring``); the watcher, or None where any step
        cannot be done (the recording goes on as before, its metadata saying why)."""
        from tracekit.record.torch_ring import TorchRing, build, library_path, write_head
        from tracekit.record.watch import Watched, Watcher

        torch_dir = os.path.dirname(os.path.abspath(self.torch.__file__))
        version = str(self.torch.__version__)
        if not library_path(torch_dir, version).exists():
            tell("tracekit: building the PyTorch tracker for this PyTorch, once (about 10 s)")
        lib, why = build(torch_dir, version)
        if lib is None:
            self.ring_note = why
            return None
        try:  # the settings the snapshot would carry (history is not on yet: a cheap call)
            settings = self.torch.cuda.memory._snapshot().get("allocator_settings")
        except Exception:
            settings = None
        try:
            write_head(trace, {"device": self.device, "info": self.info, "launch": launch,
                               "roots": list(roots), "rerun": self.rerun, "allocator_settings": settings})
        except (OSError, TypeError, ValueError) as e:
            self.ring_note = f"could not write the tracker's head ({e})"
            return None
        self.ring, self.ring_note = TorchRing.start(trace, int(self.info["max_entries"]), lib)
        self._trace = trace
        if self.ring is None:
            self._remove_head()
            return None
        watcher = Watcher.start(self.ring.path, trace, keep, kind=Watched.TORCH_RING)
        if watcher is None:
            self.ring_note = "the watcher could not be started (no pidfd_open)"
            self.remove_ring()
        return watcher

    def ring_meta(self) -> dict[str, Any]:
        return {"torch_ring": {"attached": self.ring is not None, "note": self.ring_note}}

    def remove_ring(self) -> None:
        if self.ring is not None:
            self.ring.stop()
            self.ring.remove()
            self.ring = None
        self._remove_head()

    def _remove_head(self) -> None:
        from tracekit.record.torch_ring import head_path

        if self._trace is not None:
            with contextlib.suppress(OSError):
                head_path(self._trace).unlink()

    def end(self) -> TorchEnd:
        allowed = self.info.get("allowed_bytes")
        return TorchEnd(self.path, tuple(self.states), self.device,
                        int(allowed) if isinstance(allowed, int) else None, self.rerun)

    def start(self) -> None:
        from tracekit.record.probe import torch_probe

        t = self.torch
        self.probe = torch_probe(t)
        self.view = ProgramHistory(t.cuda.memory)
        self.view.real_record(
            enabled="all", context="all", stacks="python", max_entries=self.info["max_entries"])
        self.view.install()
        t._C._cuda_attach_out_of_memory_observer(self._on_oom)

    def _on_oom(self, device: int, alloc: int, allowed: int, device_free: int) -> None:
        # Runs inside the allocator after the oom entry is recorded (and its lock released),
        # before the error is raised; nothing here may raise into the program.
        if os.getpid() != self.pid:
            return  # a forked child: the snapshot beside the trace is the parent's
        self.info["oom_observer"] = {"device": int(device), "alloc_size": int(alloc),
                                     "total_or_allowed": int(allowed), "device_free": int(device_free)}
        self.info["oom_count"] = self.info.get("oom_count", 0) + 1
        try:
            self.states.append(self.probe.state(int(device), self._pool(int(device), int(allowed))))
        except Exception as e:
            self.states.append({"device": int(device), "error": f"{type(e).__name__}: {e}"})
        if time.monotonic() - self._last_dump < DUMP_EVERY_S:
            return  # cuDNN may try many workspaces in a row: the final dump has them all
        try:
            self._dump()
        except Exception as e:  # never turn the program's OOM into a different error
            tell(f"tracekit: warning: could not dump the snapshot at OOM ({e})")

    def _pool(self, device: int, allowed: int) -> dict[str, Any]:
        cuda = self.torch.cuda
        total = self.info["total_bytes"]
        return {"used_bytes": int(cuda.memory_allocated(device)),
                "total_bytes": int(cuda.memory_reserved(device)),
                "limit_bytes": allowed if allowed < total else None}

    def _limit(self) -> None:
        obs, total = self.info.get("oom_observer"), self.info["total_bytes"]
        get = getattr(self.torch.cuda, "get_per_process_memory_fraction", None)
        frac = None
        try:
            frac = float(get()) if get is not None else None
        except Exception:  # older PyTorch or no context: leave the fraction unknown
            frac = None
        if frac is not None and frac < 1.0:
            self.info["memory_fraction"] = frac
            self.info["allowed_bytes"] = int(frac * total)
        if obs and obs["total_or_allowed"] < total:
            self.info["allowed_bytes"] = obs["total_or_allowed"]

    def _dump(self) -> dict[str, Any]:
        self._limit()
        snap = self.view.real_snapshot()
        snap["tracekit"] = dict(self.info)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                pickle.dump(snap, f, protocol=4)
            os.replace(tmp, self.path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OutputError(f"{self.path}: cannot write the snapshot ({e})") from None
        self._last_dump = time.monotonic()
        return snap

    def stop(self, code: int) -> dict[str, Any]:
        self.info["exit_code"] = code
        with contextlib.suppress(Exception):  # a broken context must not lose the history
            self.torch.cuda.synchronize()
        snap = self._dump()
        self.view.uninstall()
        self.view.real_record(enabled=None)
        with contextlib.suppress(Exception):
            self.probe.close()
        return snap


class ProgramHistory:
    """The program's own ``_record_memory_history`` and ``_snapshot``, over tracekit's history.

    PyTorch has one allocation history per process. A program that turns it on itself would, under
    ``record --torch``, see the entries tracekit's history holds from before its call, and its
    ``enabled=None`` would end tracekit's history. So while recording, ``torch.cuda.memory``'s
    ``_record_memory_history`` and ``_snapshot`` (Python functions, which ``_dump_snapshot`` also
    calls by name) are these: the program's calls change only its view (on from the last entry
    at its call, off, its ``max_entries``), tracekit's history stays on underneath, and the
    program's snapshots hold the entries recorded since it turned its history on (none while it
    is off), with tracekit's settings (Python stacks, all contexts).
    """

    def __init__(self, memory: Any) -> None:
        self.memory = memory
        self.real_record, self.real_snapshot = memory._record_memory_history, memory._snapshot
        self.on = False
        # per device: (entries then, the last entry's key) at the program's call
        self.marks: list[tuple[int, tuple[Any, ...]] | None] = []
        self.max_entries: int | None = None
        self.skip_snapshot = False

    def install(self) -> None:
        self.memory._record_memory_history, self.memory._snapshot = self.record, self.snapshot

    def uninstall(self) -> None:
        self.memory._record_memory_history, self.memory._snapshot = self.real_record, self.real_snapshot

    def record(self, enabled: Any = "all", *args: Any, **kw: Any) -> None:
        """``enabled``: "all" or True (the legacy form) turn the program's view on, anything else
        ("state": no trace entries; None, False) off; ``max_entries`` (legacy:
        ``trace_alloc_max_entries``, positional after ``context`` and ``stacks``) bounds it."""
        if enabled is True:
            entries = kw.get("trace_alloc_max_entries", args[0] if args else None)
        else:
            entries = kw.get("max_entries", args[2] if len(args) >= 3 else None)
        if enabled not in ("all", True):
            self.on = False
            return
        self.max_entries = int(entries) if isinstance(entries, int) and entries > 0 else None
        if self.on and not kw.get("clear_history"):
            return  # on already: PyTorch keeps the entries it holds, so the view keeps its start
        traces = self.real_snapshot().get("device_traces") or []
        # PyTorch notes each snapshot taken in the history (action "snapshot"): the one just taken
        # for the mark is the recorder's, not the program's, and is left out of its view
        self.marks = [(len(t), _entry_key(t[-1])) if t else None for t in traces]
        self.skip_snapshot = True
        self.on = True

    def snapshot(self, *args: Any, **kw: Any) -> dict[str, Any]:
        snap: dict[str, Any] = self.real_snapshot(*args, **kw)
        snap["device_traces"] = [self._view(d, t) for d, t in enumerate(snap.get("device_traces") or [])]
        return snap

    def _view(self, device: int, trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if not self.on:
            return []
        mark = self.marks[device] if device < len(self.marks) else None
        start = 0
        if mark is not None:
            n, key = mark
            if len(trace) >= n and _entry_key(trace[n - 1]) == key:
                start = n  # the history only grew since: the mark is where it was
            else:  # the ring buffer wrapped: the last entry like the mark
                start = next((i + 1 for i in range(len(trace) - 1, -1, -1) if _entry_key(trace[i]) == key), 0)
        if self.skip_snapshot and start < len(trace) and trace[start].get("action") == "snapshot":
            start += 1
        kept = trace[start:]
        return kept[-self.max_entries:] if self.max_entries else kept


def _entry_key(entry: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(entry.get(k) for k in ("action", "addr", "size", "stream", "time_us"))
