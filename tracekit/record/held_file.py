"""The spool's one descriptor, opened once and held for the whole recording.

Why held, not opened per flush: a descriptor opened and closed by another thread while cuFFT
makes a plan with JIT (LTO) callbacks makes that plan fail with ``CUFFT_INTERNAL_ERROR``.
Measured on an H200 with CuPy 14.2 (``scripts/gpu_cufft_callback_probe.py``, CuPy's
``examples/cufft/callback/jit_r2c_c2r_string.py``, no tracekit in the process): a thread that
opens and closes a file every 50 ms failed 6 of 8 runs; one that writes and fsyncs through a
descriptor opened before the program started failed 0 of 8, as did a thread that only computes
or sleeps. A recorder that opened its spool per flush (every 0.5 s) made that program fail 2 of 5
recorded runs and 0 of 15 plain ones.

The descriptor sits high (``F_DUPFD_CLOEXEC`` to near the soft ``RLIMIT_NOFILE``), so the program's
own descriptors get the numbers they would get without the recorder, and a program that closes
descriptors (``os.closerange(3, 1024)``) usually misses it. When the program did close it, the
number may since name a file of the program's: before every write the descriptor is checked to
still be the spool (same device and inode, ``fstat``), and is otherwise opened again. A number
that is no longer ours is never written to and never closed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import resource

# Below the soft limit, so a program that opens up to its limit still finds the usual lowest
# numbers free; clamped so a huge limit does not push the number into the millions.
HEADROOM = 32
HIGHEST = 4096


def high_floor() -> int:
    """The lowest number the held descriptor may take: ``min(soft RLIMIT_NOFILE, 4096) - 32``, at least 10."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = HIGHEST if soft == resource.RLIM_INFINITY else min(int(soft), HIGHEST)
    return max(10, limit - HEADROOM)


def move_high(fd: int) -> int:
    """``fd`` moved to a close-on-exec number at or above ``high_floor()`` (the old one closed), so a
    program that closes the low descriptors (``os.closerange(3, 1024)``) usually misses it; ``fd``
    itself where no number is free up there."""
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high_floor())
    except OSError:
        return fd
    os.close(fd)
    return high


def identity(fd: int) -> tuple[int, int] | None:
    """(device, inode) of what ``fd`` names now; None where it names nothing."""
    try:
        st = os.fstat(fd)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


class HeldFile:
    """An append-only file written through one held descriptor (``write`` appends, ``sync`` fsyncs)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self.fd: int | None = None
        self.bytes = 0  # bytes written through ``write`` so far
        self._ident: tuple[int, int] | None = None

    def open(self, flags: int = 0) -> None:
        """Open (``flags`` e.g. ``O_CREAT | O_EXCL`` the first time) and move the descriptor high."""
        high = move_high(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | flags, 0o644))
        st = os.fstat(high)
        self.fd, self._ident = high, (st.st_dev, st.st_ino)

    def write(self, data: bytes | memoryview, *, sync: bool = True) -> None:
        """Append ``data`` (and fsync); a descriptor the program closed is opened again first."""
        fd = self._held()
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            self.bytes += n  # at once: a writer interrupted after this knows the bytes are on disk
            view = view[n:]
        if sync:
            os.fsync(fd)

    def sync(self) -> None:
        """fsync what was written (through the held descriptor, opened again if the program closed it)."""
        os.fsync(self._held())

    def sync_if_held(self) -> None:
        """fsync through the held descriptor if it still is the file; never opens, never raises."""
        fd = self._ours()
        if fd is not None:
            with contextlib.suppress(OSError):  # closed at this moment by the writer: nothing to do
                os.fsync(fd)

    def _held(self) -> int:
        fd = self._ours()
        if fd is None:
            self.open()
            fd = self.fd
        assert fd is not None
        return fd

    def _ours(self) -> int | None:
        """The held descriptor if it still is the spool, else None (then forgotten, never closed)."""
        fd = self.fd
        if fd is None:
            return None
        if identity(fd) != self._ident:  # None: the program closed it (EBADF)
            self.fd = None
            return None
        return fd

    def forget(self) -> None:
        """In a forked child: drop the number without closing it (the parent's file stays open there)."""
        self.fd = None

    def close(self) -> None:
        fd = self._ours()
        self.fd = None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
