"""The spool's tail: every row the program made, in a shared mapping the process's death cannot take.

The rows wait in the program's memory (``EventBuffer.rows``) until the next spool write, at most
``interval`` (0.5 s) or ``max_events`` rows later, so a process that ends by ``os._exit``,
``exec`` or SIGKILL would take its last rows with it: the moments before a crash, the ones a user
records for. So each row also goes, in the same C step that appends it to the waiting rows
(``tracekit.record.fastpath.Rows.mirror``: eight more int64 stores and two barriers per row),
into a ring of fixed-size slots in ``SPOOL.tail``, a file beside the spool mapped ``MAP_SHARED``:
the kernel keeps what the process wrote there whatever becomes of the process. The ring's row
``seq`` is the row's index among every row the recording made, which is also its index in the
spool, so whoever finishes the spool after the process is gone (the watcher, ``tracekit recover``)
appends the ring's rows from the spool's row count on (``spool_format.SpoolFrames``).

The file is made, given its blocks (``posix_fallocate``: a store into a mapping of a file whose
blocks a full disk cannot give would kill the program with SIGBUS) and cleared before the program
starts, so the run maps, opens and faults nothing new. It holds ``2 × max_events`` rows (9.5 MB at
the default 65,536): more than the rows that can wait between two spool writes. Without the
compiled helper (``fastpath.COMPILED`` false) there is no tail: a Python-level mirror would cost
about a microsecond per row, and the recording keeps its spool alone, as before.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import numpy as np

from tracekit.record.fastpath import COMPILED, Ring, RingWriter, read_ring, ring_bytes
from tracekit.record.hook import ROW

SUFFIX = ".tail"


def tail_path(spool: Path) -> Path:
    return spool.with_name(spool.name + SUFFIX)


class Tail:
    """The open ring of a recording (made by ``open``); the rows mirror into ``ring``."""

    def __init__(self, path: Path, fd: int, mapping: mmap.mmap, ring: RingWriter) -> None:
        self.path, self._fd, self._map, self.ring = path, fd, mapping, ring

    @classmethod
    def open(cls, path: Path, rows: int) -> Tail | None:
        """A ring of ``rows`` slots at ``path`` (replacing a stale one); None where it cannot be
        made (no compiled helper, no room, a file system without shared mappings)."""
        if not COMPILED:
            return None
        size = ring_bytes(rows, ROW)
        fd = -1
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
            os.posix_fallocate(fd, 0, size)
            mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            ring = Ring(mapping, ROW)
        except (OSError, ValueError):
            if fd >= 0:
                os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(path)
            return None
        return cls(path, fd, mapping, ring)

    def close(self) -> None:
        """Stop writing (the rows keep going to the list only) and release the mapping."""
        with contextlib.suppress(Exception):
            self.ring.close()
        with contextlib.suppress(Exception):
            self._map.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = -1

    def remove(self) -> None:
        self.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def read_tail(path: Path, since: int) -> tuple[np.ndarray, int]:
    """(the ring's rows from row ``since`` on, in order, as an (n, ROW) int64 array; the rows between
    ``since`` and the ring's first one that it no longer holds). Empty where there is no ring, it
    is not one, or it holds nothing past ``since``."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return np.zeros((0, ROW), np.int64), 0
    try:
        rows, seqs = read_ring(data, since)
    except (ValueError, TypeError):  # not a ring (damaged, or another file under the name)
        return np.zeros((0, ROW), np.int64), 0
    if rows.ndim != 2 or rows.shape[1] != ROW or not len(seqs):
        return np.zeros((0, ROW), np.int64), 0
    first = int(seqs[0])
    # keep the run of consecutive rows from the first: a slot rewritten while it was read breaks it
    breaks = np.flatnonzero(np.diff(seqs) != 1)
    n = int(breaks[0]) + 1 if len(breaks) else len(seqs)
    return rows[:n].astype(np.int64), max(0, first - since)
