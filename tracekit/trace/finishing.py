"""A trace a recording's watcher is still finishing: where its mark lies, and waiting for it.

When a recorded process ends without writing its trace (``os._exit``, ``exec``, SIGKILL), the
recorder's watcher (``tracekit.record.watch``) turns the spool into the trace. It holds an
exclusive ``flock`` on ``TRACE.finishing`` (which names the recorded process's pid) from its
start until the trace is in place, so a reader that finds no trace but that mark, with the
recorded process gone, waits for the lock instead of answering "no such file" while the trace is
a moment away: ``tracekit record app.py && tracekit analyze out.parquet`` sees the trace however
the program ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

WAIT_S = 120.0  # the most a reader waits for a watcher (a finish reads the spool once more)


def mark_path(trace: Path | str) -> Path:
    return Path(f"{os.fspath(trace)}.finishing")


def wait_for(trace: Path | str, timeout: float = WAIT_S) -> None:
    """Return once no watcher is finishing ``trace``: at once when there is no mark, or the
    recorded process is still running (the recording is not over); else when the watcher lets go
    of the mark, or after ``timeout`` seconds."""
    mark = mark_path(trace)
    try:
        fd = os.open(mark, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError, ValueError):
            pid = int(os.pread(fd, 32, 0).split()[0])
            if _alive(pid):
                return
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                time.sleep(0.05)
            except OSError:
                return
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):  # a zombie has ended: its parent has not reaped it yet
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    return True
