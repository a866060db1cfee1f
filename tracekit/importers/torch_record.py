"""``record --torch``: run a PyTorch program unmodified with its memory history on, then import it.

Before the program starts, PyTorch's allocation history is turned on
(``_record_memory_history(enabled="all", context="all", stacks="python",
max_entries=MAX_ENTRIES)``; ``TRACEKIT_TORCH_MAX_ENTRIES`` overrides the ring
buffer's length) and an out-of-memory observer is attached. The snapshot is
dumped (atomically, beside the trace as ``TRACE.pickle``) when the observer
fires, so a process that dies after an OOM still leaves one, and again when
the program ends, however it ends (normal exit, ``sys.exit``, an uncaught
exception, Ctrl-C). The last snapshot is then imported into the v1 trace. The
snapshot carries a ``tracekit`` key with the command, device, versions and
the per-process memory limit (from the OOM observer, else from the memory
fraction), which becomes ``pool_limit_bytes``. PyTorch is imported only here.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from tracekit.errors import DeviceError, OutputError, UsageError

MAX_ENTRIES = 1_000_000


def snapshot_path(trace: Path) -> Path:
    """Where the raw snapshot goes: beside the trace, ``TRACE.pickle`` (PyTorch's viewer reads it)."""
    return trace.with_name(trace.name.removesuffix(".parquet") + ".pickle")


def record_torch(target: list[str], *, module: bool, output: Path | None,
                 force: bool = False) -> tuple[Path, int]:
    """Run ``target`` like ``python [-m] target...``; returns (trace path, the program's exit code)."""
    from tracekit.record.runner import check_target, default_output, refuse_existing, run_target

    check_target(target, module)
    out = Path(output) if output is not None else default_output(target, module)
    refuse_existing(out, force)
    refuse_existing(snapshot_path(out), force)  # the snapshot is written beside the trace
    if not out.parent.is_dir():
        raise OutputError(f"{out}: cannot write, folder {out.parent} does not exist")
    entries = max_entries()
    torch = _torch()
    command = ["python", "-m", *target] if module else ["python", *target]
    rec = _Recording(torch, snapshot_path(out), command, entries)
    rec.start()
    outcome = run_target(target, module)
    try:
        snap = rec.stop(outcome.code)
    finally:
        outcome.keepalive = None
    from tracekit.importers.torch_snapshot import convert
    from tracekit.trace import write_trace

    c = convert(snap, rec.path)
    write_trace(out, c.meta, c.events, c.extras)
    return out, outcome.code


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
        free, total = torch.cuda.mem_get_info()
        self.info: dict[str, Any] = {
            "command": " ".join(command), "max_entries": entries,
            "torch_version": str(torch.__version__), "cuda_version": str(torch.version.cuda),
            "device_name": str(torch.cuda.get_device_name()), "total_bytes": int(total),
            "free_bytes_at_start": int(free),
            "alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        }

    def start(self) -> None:
        t = self.torch
        t.cuda.memory._record_memory_history(
            enabled="all", context="all", stacks="python", max_entries=self.info["max_entries"])
        t._C._cuda_attach_out_of_memory_observer(self._on_oom)

    def _on_oom(self, device: int, alloc: int, allowed: int, device_free: int) -> None:
        # Runs inside the allocator after the oom entry is recorded and before the error is raised.
        self.info["oom_observer"] = {"device": int(device), "alloc_size": int(alloc),
                                     "total_or_allowed": int(allowed), "device_free": int(device_free)}
        try:
            self._dump()
        except Exception as e:  # never turn the program's OOM into a different error
            print(f"tracekit: warning: could not dump the snapshot at OOM ({e})", file=sys.stderr)

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
        snap = self.torch.cuda.memory._snapshot()
        snap["tracekit"] = dict(self.info)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                pickle.dump(snap, f, protocol=4)
            os.replace(tmp, self.path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise OutputError(f"{self.path}: cannot write the snapshot ({e})") from None
        return snap

    def stop(self, code: int) -> dict[str, Any]:
        self.info["exit_code"] = code
        with contextlib.suppress(Exception):  # a broken context must not lose the history
            self.torch.cuda.synchronize()
        snap = self._dump()
        self.torch.cuda.memory._record_memory_history(enabled=None)
        return snap
