"""The crash-safe spool, written while the program runs (layout: ``record.spool_format``).

**The program's own threads write the rows.** After each row the hook checks whether a write is
due (``EventBuffer.trim``): ``interval`` seconds (0.5 by default) after the last one, or
``max_events`` rows held. Then it packs the rows waiting, with ``struct``, into a 1 MiB buffer
made before the program started (no NumPy, no Arrow: those are for the end), writes them through
the held descriptor (``record.held_file``) behind one TEXT frame naming the call-sites, frames,
stacks and notes they use first, and deletes them. A write to the page cache survives the
process: a program killed with SIGKILL loses at most the rows of its last ``interval``.

**The spool's own thread sleeps** (``time.sleep(interval)``, never waiting on an event), fsyncs
what the program's threads wrote, and writes rows itself only when they waited ``silence``
seconds (0 by default) past their due time because the program stopped allocating, so a kill
loses at most about two intervals of rows. Why so little: another thread doing work beside
cuFFT while it makes a plan with JIT (LTO) callbacks makes that plan fail with
``CUFFT_INTERNAL_ERROR``. Measured on an H200 with CuPy 14.2 (CuPy's
``examples/cufft/callback/jit_r2c_c2r_string.py``, warm callback cache, 8 runs each unless said,
``scripts/gpu_cufft_callback_probe.py`` and ``scripts/gpu_cufft_bisect.py``): with no tracekit in
the process, a thread that every 50 ms opened and closed a file failed 6, one that allocated and
freed 8 MiB 4 of 6, one that made a 64 KiB NumPy array 5 of 6, one that built an Arrow batch 3;
one that wrote and fsynced through a held descriptor, computed, or slept, 0. Recorded with a
spool thread that woke every 50 ms (``Event.wait``) and packed and wrote every 0.5 s, without a
single mapping or file opened (``tests/cli/test_record_flusher_syscalls.py``), it still failed 4
of 8 and 5 of 8; with that thread switched off, 0 of 8 (the hook, the budget or the call-sites
switched off instead: 3, 5 and 1 of 8). As here, 0 of 12 (plain 0 of 12), and 0 of 12 with
``silence`` 0 and 5 s alike.

The spool's thread never frees what the program's threads made (the rows it writes after a
silence are deleted at the program's next trim: ``EventBuffer.written``). Only the process that
made the spool writes to it (a forked child writes nothing). A write that fails (a full disk, a
file system gone read-only) stops the spooling: ``error`` says why, the program runs on, the
events written before are kept, and later rows are dropped. A program that deletes (or replaces)
its spool while it runs loses nothing: the held descriptor still writes the recorder's file, and
``close`` keeps a way to read it (``held``) for the trace to be written from.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from tracekit.errors import OutputError
from tracekit.record.callstacks import LiveStacks
from tracekit.record.fastpath import Rows, RowStore
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
CHUNK_EVENTS = 64  # rows a frame's size is a multiple of: 512 ints, 4 KiB
HEADER = FRAME.size


def spool_path(output: Path) -> Path:
    """Where the spool of a recording that will be finalized to ``output`` lives."""
    return output.with_name(output.name + ".spool")


class SpoolWriter:
    """Writes the rows of ``buffer`` to ``path`` (from the program's threads, through
    ``EventBuffer.trim``); ``start()`` runs the spool's own thread."""

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
        silence: float = 0.0,
    ) -> None:
        self.path, self.pid = path, os.getpid()
        self._file = HeldFile(path)
        head = json.dumps({"meta": json.loads(meta.to_json()), "t0_ns": t0_ns}).encode()
        try:
            self._file.open(os.O_CREAT | os.O_EXCL)
            self.head = MAGIC + frame_header(META, 0, len(head)) + head  # kept: ``SpoolFrames(head=)``
            self._file.write(self.head)
        except FileExistsError:
            raise OutputError(f"{path}: a spool already exists (another recording, or recover it first)"
                              ) from None
        except OSError as e:
            self._file.close()
            with contextlib.suppress(OSError):  # a read-only folder: nothing was made to remove
                path.unlink(missing_ok=True)
            raise OutputError(f"{path}: cannot write the recording spool ({e.strerror})") from None
        self.buffer, self.sites, self.stacks = buffer, sites, stacks
        self.interval, self.max_events = interval, max(2, max_events)
        self.silence_ns = int(silence * 1e9)
        self.events = 0  # event rows written (note rows excluded)
        self._sites_written = self._frames_written = self._stacks_written = 0
        self._notes_written: set[int] = set()
        self._notes_order: list[int] = []  # the notes written, in order (rolled back with the rest)
        self._notes_placed = 0  # notes in the buffer, not yet in the file
        self._done = (0, 0, 0, 0)  # sites, frames, stacks and notes in the file
        self._row_at = self._row_done = 0  # ints of the rows placed in the buffer, and in the file
        self._bytes_done = self._file.bytes  # HeldFile.bytes at the last commit (the header)
        self._buf = bytearray(BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._fill = 0
        self._stop = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._kept = -1  # a descriptor that reads the spool the program deleted (``held``)
        buffer.attach(self.max_events * ROW, int(interval * 1e9), self._drain)

    def start(self) -> None:
        """Start the spool's own thread (``_watch``); it packs one chunk first, so its C allocator
        arena exists before the program does."""
        ready = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(ready,), name="tracekit-spool", daemon=True)
        self._thread.start()
        ready.wait(5)

    def _warm_up(self) -> None:
        rows = Rows(ROW)
        rows.extend(list(range(CHUNK_EVENTS * ROW)))
        rows.copy_into(bytearray(len(rows) * 8), 0, 0, len(rows))
        text_record(TextKind.NOTE, 0, {"warm": "up"})

    def _watch(self, ready: threading.Event) -> None:
        """Sleep; fsync what the program's threads wrote; write the rows they left waiting.

        While the program allocates, its own threads write the rows (``EventBuffer.trim``); this
        thread fsyncs them every ``interval`` and writes rows itself only when they have waited
        ``silence`` seconds past their due time (the program stopped allocating), so a kill
        in a silence loses nothing."""
        self._warm_up()
        ready.set()
        synced = 0
        while not self._stop.is_set():
            time.sleep(self.interval)
            buf = self.buffer
            if buf.waiting() and time.perf_counter_ns() >= buf.due + self.silence_ns:
                self.flush()
                synced = self.events
            elif self.events != synced:
                synced = self.events
                self._file.sync_if_held()

    def flush(self, *, sync: bool = True) -> int:
        """Write the rows waiting now (and what they name); returns the number of rows written.

        Never raises an ``Exception``: a failed write is kept in ``error`` and stops the spooling.
        An exception raised into it (the stop signal's, in the main thread) leaves the spool at
        its last whole frame and every row not yet in the file waiting, then goes on."""
        buf = self.buffer
        with buf.lock:
            if self._closed:  # rows of threads still allocating after the end: dropped, freed by trim
                buf.written = len(buf.rows)
                return 0
            if os.getpid() != self.pid or buf.busy:
                return 0  # a forked child's copy, or re-entered from a finalizer: write nothing
            lo, hi = buf.written, len(buf.rows)  # rows first: every id they use is named by now
            if self.error is not None:
                buf.written = hi  # dropped: the program's thread frees them (EventBuffer.trim)
                return 0
            buf.busy = True
            before = self.events
            self._row_at = self._row_done = lo
            try:
                self._text()
                self._rows(buf.rows, lo, hi)
                self._out()
                if sync:
                    self._file.sync()
            except Exception as e:  # a full disk must not break the program being recorded
                self.error = f"{type(e).__name__}: {e}"
                self._row_done = hi
            except BaseException:
                if self._file.bytes != self._bytes_done:  # the write was done, its commit not yet
                    self._commit()
                else:
                    self._roll_back()
                raise
            finally:
                self._fill = 0
                buf.written = self._row_done
                buf.busy = False
            return self.events - before

    def _commit(self) -> None:
        """What the buffer held is in the file now: its names, notes and rows count as written."""
        self._done = (self._sites_written, self._frames_written, self._stacks_written, len(self._notes_order))
        self._bytes_done = self._file.bytes
        self.events += (self._row_at - self._row_done) // ROW - self._notes_placed
        self._notes_placed = 0
        self._row_done = self._row_at

    def _roll_back(self) -> None:
        """Forget what was placed in the buffer since the last commit (it never reached the file)."""
        self._sites_written, self._frames_written, self._stacks_written, n_notes = self._done
        for index in self._notes_order[n_notes:]:
            self._notes_written.discard(index)
        del self._notes_order[n_notes:]
        self._notes_placed = 0

    def _drain(self) -> None:
        """``EventBuffer.trim``'s writer, in the program's thread (fsynced by the spool's thread)."""
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
            self._notes_order.append(index)
            self._notes_placed += 1  # its row is counted with the rows
        if recs:
            self._frame(TEXT, len(recs), recs)

    def _frame(self, tag: bytes, count: int, parts: Sequence[bytes]) -> None:
        length = sum(len(p) for p in parts)
        if self._fill + HEADER + length > BUFFER_BYTES:
            self._out()
        if HEADER + length > BUFFER_BYTES:  # larger than the buffer (names by the thousand): as is
            self._file.write(b"".join([frame_header(tag, count, length), *parts]), sync=False)
            self._commit()
            return
        self._put(frame_header(tag, count, length))
        for p in parts:
            self._put(p)

    def _put(self, data: bytes) -> None:
        n = len(data)
        self._buf[self._fill:self._fill + n] = data
        self._fill += n

    def _rows(self, rows: RowStore, lo: int, hi: int) -> None:
        """ROWS frames of ``rows[lo:hi]``, copied into the buffer (``Rows.copy_into``: one memcpy
        where compiled) at most a buffer's room at a time."""
        room = (BUFFER_BYTES - HEADER) // ROW_BYTES // CHUNK_EVENTS * CHUNK_EVENTS  # rows per frame
        while lo < hi:
            if self._fill + HEADER + CHUNK_EVENTS * ROW_BYTES > BUFFER_BYTES:
                self._out()
            k = min((hi - lo) // ROW, room, (BUFFER_BYTES - self._fill - HEADER) // ROW_BYTES)
            self._put(frame_header(ROWS, k, k * ROW_BYTES))
            end = lo + k * ROW
            self._fill += rows.copy_into(self._buf, self._fill, lo, end)
            lo = end
            self._row_at = end

    def _out(self) -> None:
        """Write the buffer and commit it. An exception raised into the write (the stop signal's)
        rolls back only if no byte reached the file (``HeldFile.bytes``): committing what is on
        disk keeps its names and rows from being written twice (an id defined twice breaks the
        recovery)."""
        fill, before = self._fill, self._file.bytes
        if fill:
            try:
                self._file.write(self._view[:fill], sync=False)
            except BaseException:
                if self._file.bytes != before:
                    self._fill = 0
                    self._commit()
                raise
        self._fill = 0
        self._commit()

    def detach(self) -> None:
        """In a forked child: never write (the spool's thread did not survive the fork)."""
        self.pid = -1
        self._thread = None
        self._file.forget()
        self.buffer.detach()

    def close(self) -> None:
        """Stop the spool's thread, write what is left and the end frame; a failure is kept in
        ``error`` (the spool then ends at its last whole frame), never raised. Under the lock from
        the last flush to the end frame, so no write of another thread comes after it."""
        self._stop.set()  # the thread ends at its next wake-up; a flush after this writes nothing
        with self.buffer.lock:
            self.flush()
            try:
                if self.error is None and os.getpid() == self.pid:
                    self._file.write(frame_header(END, 0, 0))
            except Exception as e:  # a full disk at the very end: what was written stays recoverable
                self.error = self.error or f"{type(e).__name__}: {e}"
            finally:
                self._closed = True
                if os.getpid() == self.pid:
                    self._keep_if_gone()
                    self._file.close()
        self.buffer.trim()

    def _keep_if_gone(self) -> None:
        """Where the path no longer names the file the held descriptor writes (the program deleted or
        replaced it), open that file to read through ``/proc/self/fd`` (``held``)."""
        fd = self._file.fd
        try:
            mine = fd is not None and os.fstat(fd)
        except OSError:
            return
        if not mine or (mine.st_dev, mine.st_ino) != self._file._ident:
            return  # no descriptor of ours is left: the path is all there is
        with contextlib.suppress(OSError):
            if os.path.samestat(mine, os.stat(self.path)):
                return
        with contextlib.suppress(OSError):
            self._kept = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)

    @property
    def held(self) -> Path | None:
        """After ``close``: the spool as the recorder wrote it, where the program deleted or replaced
        the file at ``path`` (a ``/proc/self/fd`` path, readable until ``release``); else None."""
        return Path(f"/proc/self/fd/{self._kept}") if self._kept >= 0 else None

    def release(self) -> None:
        if self._kept >= 0:
            with contextlib.suppress(OSError):
                os.close(self._kept)
            self._kept = -1
