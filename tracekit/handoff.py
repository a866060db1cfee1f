"""An object the parent holds, handed to worker processes through shared memory (read once, mapped).

A worker of ``tracekit.workers.Pool`` is a fresh interpreter: it used to read the trace file again
and check it (10M events: 1-2 s per worker, each with its own copy). ``share(obj)`` pickles the
object with protocol 5 and writes every large buffer it holds out of band (NumPy arrays, Arrow
buffers: the events and the extra columns) into one file under ``/dev/shm`` (memory, shared by
every process that maps it), or the temporary folder where that has no room; the pickle proper,
a few KB of metadata, travels in the ``Shared`` handle. ``attach(handle)`` in a worker maps the
file copy-on-write (a worker that writes into an array changes its own page, never the parent's
or another worker's) and unpickles over the mapped buffers: no copy, no parse, no check, and the
same bytes the parent holds, so the "file changed while the command ran" case cannot arise.
The owner ``release``s the file when its pool is done; a file left by a process that was killed
is removed by the next ``share`` (its pid is gone).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import pickle
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREFIX = "tracekit-handoff-"
ALIGN = 64  # bytes: each buffer starts on a cache line (NumPy wants at least its itemsize)
SHM = Path("/dev/shm")
MIN_BYTES = 1 << 20  # below this the object is pickled to each worker as it is


@dataclass(frozen=True)
class Shared:
    """A handle to an object in shared memory: the file, the pickle and where each buffer lies."""

    path: str
    payload: bytes
    spans: tuple[tuple[int, int], ...]  # (offset, bytes) of each out-of-band buffer, in order
    size: int  # the file's bytes


def _folder(need: int) -> Path:
    """``/dev/shm`` where it has room for ``need`` bytes and a margin, else the temporary folder."""
    with contextlib.suppress(OSError):
        st = os.statvfs(SHM)
        if st.f_bavail * st.f_frsize > 2 * need + (64 << 20):
            return SHM
    return Path(tempfile.gettempdir())


def _sweep(folder: Path) -> None:
    """Remove the files of processes that are gone (killed before they released their file)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(PREFIX):
                continue
            pid = entry.name[len(PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # someone else's process
    return True


def share(obj: Any) -> Shared | None:
    """``obj`` in a shared file (see the module docstring); None where its buffers are small (pickle
    it as it is) or no file could be written (the caller hands the object over its old way)."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    views = [b.raw() for b in buffers]
    total = sum(v.nbytes for v in views)
    if total < MIN_BYTES:
        return None
    folder = _folder(total)
    _sweep(folder)
    spans, offset = [], 0
    for v in views:
        offset = -(-offset // ALIGN) * ALIGN
        spans.append((offset, v.nbytes))
        offset += v.nbytes
    size = max(offset, 1)
    fd, name = -1, ""
    try:
        fd, name = tempfile.mkstemp(prefix=f"{PREFIX}{os.getpid()}-", dir=folder)
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            for (start, n), v in zip(spans, views, strict=True):
                mm[start:start + n] = v
    except (OSError, ValueError):
        if name:
            with contextlib.suppress(OSError):
                os.unlink(name)
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    return Shared(name, payload, tuple(spans), size)


def attach(handle: Shared) -> Any:
    """The object of ``handle``, its buffers mapped copy-on-write from the shared file."""
    fd = os.open(handle.path, os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, handle.size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    view = memoryview(mm)
    return pickle.loads(handle.payload, buffers=[view[s:s + n] for s, n in handle.spans])


def release(handle: Shared | None) -> None:
    """Remove the shared file (workers that mapped it keep their mapping until they end)."""
    if handle is not None:
        with contextlib.suppress(OSError):
            os.unlink(handle.path)
