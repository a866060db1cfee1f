"""An object the parent holds, handed to worker processes through shared memory (read once, mapped).

A worker of ``tracekit.workers.Pool`` is a fresh interpreter: it used to read the trace file again
and check it (10M events: 1-2 s per worker, each with its own copy). ``share(obj)`` pickles the
object with protocol 5 and writes every large buffer it holds out of band (NumPy arrays, Arrow
buffers: the events and the extra columns) into one file under ``/dev/shm`` (memory, shared by
every process that maps it; the space is reserved first, so a full one is a refusal, never a
bus error); where ``/dev/shm`` lacks the room or the memory is not there to spare, nothing is
shared and the workers read the file as before. The pickle proper, a few KB of metadata, travels
in the ``Shared`` handle. ``attach(handle)`` in a worker maps the
file copy-on-write (a worker that writes into an array changes its own page, never the parent's
or another worker's) and unpickles over the mapped buffers: no copy, no parse, no check, and the
same bytes the parent holds, so the "file changed while the command ran" case cannot arise.
The owner holds a shared ``flock`` on the file until it ``release``s it (when its pool is done);
a file nobody holds a lock on, older than a minute, was left by a process that was killed and
is removed by the next ``share`` (a lock, not a pid: pids do not cross containers).
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import pickle
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.errors import TracekitError

PREFIX = "tracekit-handoff-"
ALIGN = 64  # bytes: each buffer starts on a cache line (NumPy wants at least its itemsize)
SHM = Path("/dev/shm")
MIN_BYTES = 1 << 20  # below this the object is pickled to each worker as it is
STALE_S = 60.0  # an unlocked file older than this is a killed process's
_HELD: dict[str, int] = {}  # path -> the descriptor holding this process's shared lock on it


@dataclass(frozen=True)
class Shared:
    """A handle to an object in shared memory: the file, the pickle and where each buffer lies."""

    path: str
    payload: bytes
    spans: tuple[tuple[int, int], ...]  # (offset, bytes) of each out-of-band buffer, in order
    size: int  # the file's bytes


def _room(need: int) -> bool:
    """Whether ``/dev/shm`` and the memory this process may still take hold ``need`` bytes, with a
    margin (its pages are memory, charged to this process's cgroup)."""
    from tracekit.workers import available_memory

    try:
        st = os.statvfs(SHM)
    except OSError:
        return False
    spare = available_memory()
    return st.f_bavail * st.f_frsize > 2 * need + (64 << 20) and (spare is None or spare > 2 * need)


def _sweep(folder: Path) -> None:
    """Remove the files no process holds (killed before it released them)."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(PREFIX) or entry.path in _HELD:
                continue
            with contextlib.suppress(OSError):
                if now - entry.stat().st_mtime < STALE_S:
                    continue  # being made: its owner takes its lock right after mkstemp
                fd = os.open(entry.path, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # OSError: an owner holds it
                    os.unlink(entry.path)
                finally:
                    os.close(fd)


def share(obj: Any) -> Shared | None:
    """``obj`` in a shared file (see the module docstring); None where its buffers are small (pickle
    it as it is) or no file could be made (the caller hands the object over its old way)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    total = sum(v.nbytes for v in views)
    if total < MIN_BYTES:
        return None
    _sweep(SHM)
    if not _room(total):
        return None
    spans, offset = [], 0
    for v in views:
        offset = -(-offset // ALIGN) * ALIGN
        spans.append((offset, v.nbytes))
        offset += v.nbytes
    size = max(offset, 1)
    fd, name = -1, ""
    try:
        fd, name = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=SHM)
        fcntl.flock(fd, fcntl.LOCK_SH)  # held until release: no sweep removes it meanwhile
        os.posix_fallocate(fd, 0, size)  # ENOSPC here, not SIGBUS at the first write into the map
        with mmap.mmap(fd, size) as mm:
            for (start, n), v in zip(spans, views, strict=True):
                mm[start:start + n] = v
    except (OSError, ValueError):
        _drop(fd, name)
        return None
    except BaseException:  # an interrupt: the file must not stay in memory
        _drop(fd, name)
        raise
    _HELD[name] = fd
    return Shared(name, payload, tuple(spans), size)


def _drop(fd: int, name: str) -> None:
    if name:
        with contextlib.suppress(OSError):
            os.unlink(name)
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)


def attach(handle: Shared) -> Any:
    """The object of ``handle``, its buffers mapped copy-on-write from the shared file."""
    try:
        fd = os.open(handle.path, os.O_RDONLY)
    except OSError as e:
        raise TracekitError(f"the shared copy of the trace ({handle.path}) is gone ({e.strerror}); "
                            "run the command again") from None
    try:
        mm = mmap.mmap(fd, handle.size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    view = memoryview(mm)
    return pickle.loads(handle.payload, buffers=[view[s:s + n] for s, n in handle.spans])


def release(handle: Shared | None) -> None:
    """Remove the shared file and drop the lock on it (workers that mapped it keep their mapping
    until they end)."""
    if handle is not None:
        _drop(_HELD.pop(handle.path, -1), handle.path)
