"""``record --torch``'s events where the process's death cannot take them: a tracker ring.

PyTorch keeps its memory history in the recorded process's memory: a program that ends by
``os._exit``, ``exec`` or SIGKILL takes it along, and only a snapshot dumped at an earlier OOM would
remain. So the recorder also attaches a small C++ *trace tracker* to the caching allocator
(``_torch_tracker.cpp``: ``c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker``, which
PyTorch calls with every entry it records, the same entries as the history), and the tracker writes
one row of ``ROW_INTS`` int64 per entry into a ring of slots in ``TRACE.parquet.torchring``, a file
mapped ``MAP_SHARED`` (the layout of ``tracekit.record.fastpath``'s ring, read by its
``read_ring``). Beside it, ``TRACE.parquet.torchhead`` (JSON) holds what the recorder knew at the
start (the command, device, allocator settings, launch, how to run it again). When the recording
ends normally the trace comes from PyTorch's own snapshot, as before, and both files are removed;
when the process is gone without finishing, the recorder's watcher (``tracekit.record.watch``)
builds the snapshot PyTorch would have given from the ring (``snapshot_from_ring``: the same
actions, addresses, sizes, streams and times; no frames, the process being gone) and writes the
trace through the same converter (``tracekit.record.torch_trace.write_torch_trace``).

The tracker is compiled once per PyTorch build (a C++ compiler and PyTorch's headers are needed,
about 10 s; ``build``), in a separate process so the recorded program's imports stay its own, into
tracekit's folder where it may write, else a per-user cache folder. Where it cannot be built or
attached, the recording goes on without it and its metadata says why (``torch_ring``).

Ring size: ``max_entries`` slots (PyTorch's own history bound), 56 bytes each: 56 MB at the default
1,000,000, given its blocks before the program starts so a full disk cannot fault a store.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import mmap
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tracekit.record.fastpath import Ring, read_ring, ring_bytes

ROW_INTS = 6
ACTION, DEVICE, ADDR, SIZE, STREAM, TIME_US = range(ROW_INTS)
# tracekit's codes in the ring (_torch_tracker.cpp's Code) -> the action names of PyTorch's history
ACTIONS = {1: "alloc", 2: "free_requested", 3: "free_completed", 4: "segment_alloc", 5: "segment_free",
           6: "segment_map", 7: "segment_unmap", 9: "oom"}  # 8 (snapshot) and 0 (other): no row
SOURCE = Path(__file__).with_name("_torch_tracker.cpp")
RING_SUFFIX, HEAD_SUFFIX = ".torchring", ".torchhead"
BUILD_TIMEOUT_S = 300.0


def ring_path(trace: Path) -> Path:
    return trace.with_name(trace.name + RING_SUFFIX)


def head_path(trace: Path) -> Path:
    return trace.with_name(trace.name + HEAD_SUFFIX)


# ---- building the tracker ------------------------------------------------------------------------


def _key(torch_dir: str, version: str) -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch_dir}\0{version}\0{sys.version_info[:2]}".encode())
    return h.hexdigest()[:16]


def library_path(torch_dir: str, version: str) -> Path:
    """Where the tracker for this PyTorch is (or would be) built: tracekit's folder where writable,
    else ``$XDG_CACHE_HOME/tracekit`` (``~/.cache``), else the temporary folder, per user."""
    name = f"_torch_tracker-{_key(torch_dir, version)}.so"
    here = SOURCE.parent
    if os.access(here, os.W_OK):
        return here / name
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if os.path.isdir(os.path.dirname(cache) or "/") and os.access(os.path.dirname(cache) or "/", os.W_OK):
        return Path(cache) / "tracekit" / name
    return Path(tempfile.gettempdir()) / f"tracekit-{os.getuid()}" / name


def build(torch_dir: str, version: str) -> tuple[Path | None, str | None]:
    """The tracker's shared library for the PyTorch at ``torch_dir``, built where missing: (path,
    None), or (None, why it could not be). The build runs in a child process (``python -m
    tracekit.record.torch_ring build``), so nothing it imports reaches the recorded program."""
    lib = library_path(torch_dir, version)
    if lib.exists():
        return lib, None
    try:
        p = subprocess.run([sys.executable, "-m", "tracekit.record.torch_ring", "build", str(lib)],
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                           stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"could not build the tracker ({type(e).__name__}: {e})"
    if p.returncode != 0 or not lib.exists():
        last = (p.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"could not build the tracker ({last[:300]})"
    return lib, None


def _compile(lib: Path) -> int:
    """The child's work: compile ``SOURCE`` into ``lib`` against the PyTorch importable here."""
    import shutil

    import torch
    from torch.utils import cpp_extension

    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        print("no C++ compiler (c++ or g++, or $CXX) on PATH", file=sys.stderr)
        return 1
    try:
        includes = cpp_extension.include_paths(device_type="cuda")
        libs = cpp_extension.library_paths(device_type="cuda")
    except TypeError:  # PyTorch before 2.6: include_paths(cuda=True)
        includes = cpp_extension.include_paths(cuda=True)  # type: ignore[call-arg]
        libs = cpp_extension.library_paths(cuda=True)  # type: ignore[call-arg]
    abi = int(bool(torch.compiled_with_cxx11_abi()))
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    lib.parent.mkdir(parents=True, exist_ok=True)
    tmp = lib.with_name(f".{lib.name}.{os.getpid()}.tmp")
    cmd = [cxx, "-O2", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           *(f"-I{i}" for i in includes), str(SOURCE), "-o", str(tmp),
           *(f"-L{d}" for d in libs), f"-L{torch_lib}", "-lc10_cuda", "-lc10", f"-Wl,-rpath,{torch_lib}"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        tmp.unlink(missing_ok=True)
        print(" ".join(p.stderr.split())[-2000:] or f"{cxx} failed", file=sys.stderr)
        return 1
    os.replace(tmp, lib)  # whole or not at all: a second recording may be building it too
    return 0


# ---- the ring in the recorded process ------------------------------------------------------------


@dataclass
class TorchRing:
    """The ring of a running recording, with the tracker writing into it."""

    path: Path
    fd: int
    mapping: mmap.mmap
    lib: Any  # ctypes.CDLL

    @classmethod
    def start(cls, trace: Path, slots: int, lib_path: Path) -> tuple[TorchRing | None, str | None]:
        """Make the ring beside ``trace`` and attach the tracker: (ring, None) or (None, why not)."""
        path = ring_path(trace)
        fd = -1
        try:
            lib = ctypes.CDLL(str(lib_path))
            lib.tk_row_ints.restype = ctypes.c_int64
            lib.tk_start.argtypes = [ctypes.c_void_p, ctypes.c_int64]
            lib.tk_start.restype = ctypes.c_int
            lib.tk_seq.restype = ctypes.c_int64
            if lib.tk_row_ints() != ROW_INTS:
                return None, "the tracker's rows do not match this tracekit"
            size = ring_bytes(slots, ROW_INTS)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            header = Ring(mapping, ROW_INTS)  # lays out the header and clears the slots
            nslots = int(header.nslots)
            header.close()
            words = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
            if lib.tk_start(ctypes.c_void_p(words), nslots) != 0:
                raise OSError("PyTorch refused the trace tracker")
        except (OSError, ValueError, AttributeError) as e:
            if fd >= 0:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return None, f"no tracker ring ({type(e).__name__}: {e})"
        return cls(path, fd, mapping, lib), None

    def stop(self) -> int:
        """The tracker stops writing; the rows it wrote. The mapping stays (a call in flight may
        still store into it) until the process ends; the file is removed by ``remove``."""
        self.lib.tk_stop()
        return int(self.lib.tk_seq())

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
        self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def write_head(trace: Path, head: dict[str, Any]) -> None:
    """What the watcher needs besides the ring, written before the program starts."""
    path = head_path(trace)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(head))
    os.replace(tmp, path)


def read_head(trace: Path) -> dict[str, Any]:
    try:
        head = json.loads(head_path(trace).read_text())
    except (OSError, ValueError):
        return {}
    return head if isinstance(head, dict) else {}


# ---- after the process: the ring as PyTorch's snapshot -------------------------------------------


@dataclass(frozen=True)
class RingRead:
    """The ring's whole rows in order, and how many it no longer holds (lapped) or lost mid-write."""

    rows: np.ndarray  # (n, ROW_INTS) int64
    missing: int


def read_rows(path: Path) -> RingRead | None:
    """Every whole row in the ring at ``path``, oldest first; None where it is not a ring."""
    try:
        data = path.read_bytes()
        rows, seqs = read_ring(data)
    except (OSError, ValueError, TypeError):
        return None
    if rows.ndim != 2 or rows.shape[1] != ROW_INTS:
        return None
    missing = int(seqs[-1] + 1 - len(seqs)) if len(seqs) else 0
    return RingRead(rows.astype(np.int64), missing)


def snapshot_from_ring(read: RingRead, head: dict[str, Any]) -> dict[str, Any]:
    """The snapshot PyTorch's ``_snapshot()`` would have given for these rows (no segments: the
    history is whole from the recording's start; no frames), per device, in the order written."""
    rows = read.rows
    devices = rows[:, DEVICE]
    top = int(devices.max()) + 1 if len(rows) else int(head.get("device", 0)) + 1
    traces: list[list[dict[str, Any]]] = [[] for _ in range(max(top, 1))]
    for action, device, addr, size, stream, t_us in rows.tolist():
        name = ACTIONS.get(action)
        if name is None or device < 0:
            continue
        entry: dict[str, Any] = {"action": name, "addr": addr, "size": size, "stream": stream,
                                 "time_us": t_us, "frames": []}
        if name == "oom":  # PyTorch: addr holds the free bytes CUDA reported
            entry["device_free"], entry["addr"] = addr, 0
        traces[device].append(entry)
    snap: dict[str, Any] = {"segments": [], "device_traces": traces}
    settings = head.get("allocator_settings")
    if isinstance(settings, dict):
        snap["allocator_settings"] = settings
    info = head.get("info")
    if isinstance(info, dict):
        snap["tracekit"] = dict(info)
    return snap


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "build":
        return _compile(Path(argv[1]))
    print("usage: python -m tracekit.record.torch_ring build LIBRARY.so", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
