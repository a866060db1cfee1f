"""The crash-safe spool, written while the program runs (layout: ``record.spool_format``).

A background thread (the flusher) writes the hook's rows waiting in the ``EventBuffer`` to the
spool at least every ``interval`` seconds (0.5 by default) and as soon as ``max_events // 2``
rows wait, then ``fsync``s, so a process killed with SIGKILL (or a machine that dies) loses at
most the last interval of events. Before the rows, one TEXT frame names what they use first:
call-sites, frames, stacks and notes.

**The flusher never changes the process's address space.** Another thread that maps or unmaps
memory, or opens and closes a file, while cuFFT makes a plan with JIT (LTO) callbacks makes that
plan fail with ``CUFFT_INTERNAL_ERROR`` (measured on an H200 with CuPy 14.2,
``scripts/gpu_cufft_callback_probe.py``, CuPy's ``examples/cufft/callback/jit_r2c_c2r_string.py``,
no tracekit in the process: a thread that every 50 ms allocated and freed 8 MiB failed 4 of 6
runs, one that made a 64 KiB NumPy array 5 of 6, one that built an Arrow batch 3 of 8, one that
opened and closed a file 6 of 8; one that only wrote and fsynced through a held descriptor, only
computed or only slept, 0 of 8). So the flusher

- packs rows with ``struct`` into a 1 MiB buffer allocated before the program starts (chunks of
  ``CHUNK_EVENTS`` rows: its only temporaries are a few KiB, reused by the C allocator), never
  through NumPy or Arrow;
- never frees what the program's threads made: it does not delete the rows it wrote, it marks
  them written (``EventBuffer.written``); the program's own thread deletes them in
  ``EventBuffer.trim``, called by the hook when ``max_events`` rows are held (freeing a million
  Python ints can hand whole arenas back to the system);
- writes through one descriptor opened before the program starts and held to the end
  (``record.held_file``), checked before each write to still be the spool.

Only the process that made the spool writes to it (a forked child writes nothing). A write
that fails (a full disk, a file system gone read-only) stops the spooling: ``error`` says why,
the program runs on, the events written before are kept, and later rows are dropped.
"""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tracekit.errors import OutputError
from tracekit.record.callstacks import LiveStacks
from tracekit.record.held_file import HeldFile
from tracekit.record.hook import ROW, EventBuffer
from tracekit.record.sites import SiteTable
from tracekit.record.spool_format import (
    END,
    FRAME,
    MAGIC,
    META,
    ROW_BYTES,
    ROWS,
    TEXT,
    TextKind,
    frame_header,
    text_record,
)
from tracekit.trace.schema import TraceMeta

BUFFER_BYTES = 1 << 20
CHUNK_EVENTS = 64  # rows packed per struct call: 512 ints, a 4 KiB slice
CHUNK = [struct.Struct(f"<{k * ROW}q") for k in range(CHUNK_EVENTS + 1)]
HEADER = FRAME.size


def spool_path(output: Path) -> Path:
    """Where the spool of a recording that will be finalized to ``output`` lives."""
    return output.with_name(output.name + ".spool")


class SpoolWriter:
    """Writes the rows of ``buffer`` to ``path``; ``start()`` runs the flusher thread."""

    def __init__(
        self,
        path: Path,
        meta: TraceMeta,
        buffer: EventBuffer,
        sites: SiteTable | None,
        t0_ns: int,
        *,
        interval: float = 0.5,
        max_events: int = 65536,
        stacks: LiveStacks | None = None,
    ) -> None:
        self.path, self.pid = path, os.getpid()
        self._file = HeldFile(path)
        head = json.dumps({"meta": json.loads(meta.to_json()), "t0_ns": t0_ns}).encode()
        try:
            self._file.open(os.O_CREAT | os.O_EXCL)
            self._file.write(MAGIC + frame_header(META, 0, len(head)) + head)
        except FileExistsError:
            raise OutputError(f"{path}: a spool already exists (another recording, or recover it first)"
                              ) from None
        except OSError as e:
            self._file.close()
            path.unlink(missing_ok=True)
            raise OutputError(f"{path}: cannot write the recording spool ({e.strerror})") from None
        self.buffer, self.sites, self.stacks = buffer, sites, stacks
        self.interval, self.max_events = interval, max(2, max_events)
        self.events = 0  # event rows written (note rows excluded)
        self._sites_written = self._frames_written = self._stacks_written = 0
        self._notes_written: set[int] = set()
        self._buf = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._fill = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        buffer.attach(self.max_events * ROW, self._drain)

    def start(self) -> None:
        """Start the flusher; it runs one empty flush first, so its thread's allocator state
        (the C allocator's arena of a new thread) exists before the program does."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="tracekit-spool", daemon=True)
        self._thread.start()
        ready.wait(5)

    def _run(self, ready: threading.Event) -> None:
        self._warm_up()
        ready.set()
        last = time.monotonic()
        poll = min(0.05, self.interval)
        half = self.max_events // 2 * ROW
        while not self._stop.wait(poll):
            now = time.monotonic()
            if now - last >= self.interval or self.buffer.waiting() >= half:
                self.flush()
                last = now

    def _warm_up(self) -> None:
        rows = list(range(CHUNK_EVENTS * ROW))
        CHUNK[CHUNK_EVENTS].pack_into(self._buf, 0, *rows[:])
        text_record(TextKind.NOTE, 0, {"warm": "up"})

    def flush(self, *, sync: bool = True) -> int:
        """Write the rows waiting now (and what they name); returns the number of rows written.

        Never raises: a failed write is kept in ``error`` and stops the spooling."""
        buf = self.buffer
        with buf.lock:
            if os.getpid() != self.pid or buf.busy:
                return 0  # a forked child's copy, or re-entered from a finalizer: write nothing
            lo, hi = buf.written, len(buf.rows)  # rows first: every id they use is named by now
            if self.error is not None:
                buf.written = hi  # dropped: the program's thread frees them (EventBuffer.trim)
                return 0
            buf.busy = True
            try:
                self._text()
                self._rows(buf.rows, lo, hi)
                self._out()
                if sync:
                    self._file.sync()
            except Exception as e:  # a full disk must not break the program being recorded
                self.error = f"{type(e).__name__}: {e}"
                self._fill = 0
                return 0
            finally:
                buf.written = hi
                buf.busy = False
            n = (hi - lo) // ROW
            self.events += n
            return n

    def _drain(self) -> None:
        """``EventBuffer.trim``'s writer, in the program's thread: what the flusher has not written."""
        self.flush(sync=False)

    def _text(self) -> None:
        """One TEXT frame with the names, frames, stacks and notes defined since the last."""
        recs: list[bytes] = []
        if self.sites is not None:
            names = self.sites.names_since(self._sites_written)
            recs += [text_record(TextKind.SITE, self._sites_written + i, n) for i, n in enumerate(names)]
            self._sites_written += len(names)
        st = self.stacks
        if st is not None:
            frames = st.frames_since(self._frames_written)
            recs += [text_record(TextKind.FRAME, self._frames_written + i, *f) for i, f in enumerate(frames)]
            self._frames_written += len(frames)
            links = st.stacks_since(self._stacks_written)
            recs += [text_record(TextKind.STACK, self._stacks_written + i, *k) for i, k in enumerate(links)]
            self._stacks_written += len(links)
        notes = self.buffer.notes
        for index in [i for i in list(notes) if i not in self._notes_written]:
            recs.append(text_record(TextKind.NOTE, index, notes[index]))
            self._notes_written.add(index)
            self.events -= 1  # its row is counted with the rows
        if recs:
            self._frame(TEXT, len(recs), recs)

    def _frame(self, tag: bytes, count: int, parts: Sequence[bytes]) -> None:
        length = sum(len(p) for p in parts)
        if self._fill + HEADER + length > BUFFER_BYTES:
            self._out()
        if HEADER + length > BUFFER_BYTES:  # larger than the buffer (names by the thousand): as is
            self._file.write(b"".join([frame_header(tag, count, length), *parts]), sync=False)
            return
        self._put(frame_header(tag, count, length))
        for p in parts:
            self._put(p)

    def _put(self, data: bytes) -> None:
        n = len(data)
        self._buf[self._fill:self._fill + n] = data
        self._fill += n

    def _rows(self, rows: list[int], lo: int, hi: int) -> None:
        """ROWS frames of ``rows[lo:hi]``, packed into the buffer ``CHUNK_EVENTS`` rows at a time."""
        room = (BUFFER_BYTES - HEADER) // ROW_BYTES // CHUNK_EVENTS * CHUNK_EVENTS  # rows per frame
        step = CHUNK_EVENTS * ROW
        while lo < hi:
            if self._fill + HEADER + CHUNK_EVENTS * ROW_BYTES > BUFFER_BYTES:
                self._out()
            k = min((hi - lo) // ROW, room, (BUFFER_BYTES - self._fill - HEADER) // ROW_BYTES)
            self._put(frame_header(ROWS, k, k * ROW_BYTES))
            end = lo + k * ROW
            at = self._fill
            for i in range(lo, end, step):
                j = min(i + step, end)
                CHUNK[(j - i) // ROW].pack_into(self._buf, at, *rows[i:j])
                at += (j - i) * 8
            self._fill, lo = at, end

    def _out(self) -> None:
        if self._fill:
            self._file.write(self._view[:self._fill], sync=False)
            self._fill = 0

    def detach(self) -> None:
        """In a forked child: never write (the flusher thread did not survive the fork)."""
        self.pid = -1
        self._thread = None
        self._file.forget()
        self.buffer.detach()

    def close(self) -> None:
        """Stop the flusher, write what is left and the end frame; a failure is kept in ``error``
        (the spool then ends at its last whole frame), never raised."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.flush()
        try:
            if self.error is None and os.getpid() == self.pid:
                self._file.write(frame_header(END, 0, 0))
        except Exception as e:  # a full disk at the very end: what was written stays recoverable
            self.error = self.error or f"{type(e).__name__}: {e}"
        finally:
            if os.getpid() == self.pid:
                self._file.close()
                self.buffer.trim()
