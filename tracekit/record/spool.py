"""The crash-safe spool: an Arrow IPC stream written while the program runs.

A background thread moves rows from the ``EventBuffer`` into one record batch
at least every ``interval`` seconds (0.5 by default) and as soon as
``max_events`` rows wait, writes it to the stream and ``fsync``s the file, so
a process killed with SIGKILL (or a machine that dies) loses at most the
last interval of events. Each batch holds, in order, the names of call-sites
first used since the last batch (``op`` -1, ``site`` = id, ``text`` = name),
the frames and stacks first seen since then (``op`` -3: ``site`` = frame id,
``addr`` = line + 1, ``size`` = kind, ``text`` = JSON ``[file, function]``;
``op`` -4: ``site`` = stack id, ``addr`` = its frame, ``size`` = parent + 1),
then the events (``stack``: the stack id, -1 none), with note rows (``op``
-2, ``text`` = JSON) right after the event they describe; ``pool`` and
``device_free`` are the v2 columns (-1 for "resolve later" and "not
measured"; spools written before them lack both, and spools before whole
stacks lack ``stack``).
Times are nanoseconds since the recording started, clamped so they never
decrease (threads can stamp a row a little before another thread appends an
earlier one). The stream's schema metadata holds the trace metadata known at
start. ``tracekit.record.recover`` turns a spool into a trace; a batch cut
short by a kill is skipped.

The spool is written through one descriptor opened before the program starts and held to the
end (``record.held_file``: ``O_APPEND | O_CLOEXEC``, moved high): each flush writes the batch's
encapsulated IPC message (the bytes ``pyarrow.ipc.new_stream`` would write) and ``fsync``s. It is
not opened per flush, because a descriptor opened and closed beside cuFFT's plan creation with
JIT callbacks makes that plan fail (measured; see ``held_file``). Before each write the
descriptor is checked to still be the spool, so a program that closes descriptors it did not
open (``os.closerange(3, 1024)``, as daemons do) or ``dup2``s over them cannot lose or misdirect
the recording (the spool is opened again), and no child it ``exec``s inherits the file. Only the process that
made the spool writes to it (a forked child finds another pid and writes
nothing). A write that fails (a full disk, a file system gone read-only)
stops the spooling: ``error`` says why, the program runs on, and the events
written before are kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.errors import OutputError
from tracekit.record.callstacks import LiveStacks
from tracekit.record.held_file import HeldFile
from tracekit.record.hook import NOTE, ROW, EventBuffer, unpack
from tracekit.record.sites import SiteTable
from tracekit.trace.schema import META_KEY, TraceMeta

SPOOL_KEY = b"tracekit_spool"
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # Arrow IPC: continuation marker, length 0
SITE_ROW, NOTE_ROW, FRAME_ROW, STACK_ROW = -1, -2, -3, -4

SPOOL_SCHEMA = pa.schema([
    ("t_ns", pa.int64()), ("op", pa.int8()), ("addr", pa.uint64()), ("size", pa.uint64()),
    ("rounded", pa.uint64()), ("stream", pa.uint64()), ("device", pa.int16()), ("site", pa.int32()),
    ("text", pa.string()), ("pool", pa.int32()), ("device_free", pa.int64()),
])
# The columns every spool since version 2 holds (SPOOL_SCHEMA) and what this recorder writes: those
# and the request's stack id (-1 none; absent from spools written before whole stacks).
STACK_FIELD = pa.field("stack", pa.int32())
WRITE_SCHEMA = SPOOL_SCHEMA.append(STACK_FIELD)
# pool: -1 = resolve from the segments when the trace is written; device_free: -1 = not measured.


def spool_path(output: Path) -> Path:
    """Where the spool of a recording that will be finalized to ``output`` lives."""
    return output.with_name(output.name + ".spool")


class SpoolWriter:
    """Writes batches from ``buffer`` to ``path``; ``start()`` runs the periodic flusher."""

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
        schema = WRITE_SCHEMA.with_metadata({META_KEY: meta.to_json().encode(), SPOOL_KEY: b"1"})
        try:
            self._file.open(os.O_CREAT | os.O_EXCL)
            self._append(schema.serialize().to_pybytes())
        except FileExistsError:
            raise OutputError(f"{path}: a spool already exists (another recording, or recover it first)"
                              ) from None
        except OSError as e:
            self._file.close()
            with contextlib.suppress(OSError):
                path.unlink()
            raise OutputError(f"{path}: cannot write the recording spool ({e.strerror})") from None
        self.buffer, self.sites, self.stacks, self.t0 = buffer, sites, stacks, t0_ns
        self.interval, self.max_events = interval, max_events
        self.events = 0  # event rows written (notes and site names excluded)
        self._sites_written = self._frames_written = self._stacks_written = 0
        self._last_t = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None
        self._warm_up()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tracekit-spool", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        poll = min(0.05, self.interval)
        while not self._stop.wait(poll):
            now = time.monotonic()
            if now - last >= self.interval or len(self.buffer.rows) >= self.max_events * ROW:
                try:
                    self.flush()
                except Exception as e:  # a full disk must not kill the program being recorded
                    self.error = f"{type(e).__name__}: {e}"
                last = now

    def flush(self) -> int:
        """Write what the buffer holds now as one batch; returns the number of event rows."""
        with self._lock:
            if os.getpid() != self.pid:
                return 0  # a forked child's copy: write nothing
            if self.error is not None:
                self.buffer.take()  # the spool failed: drop the rows, so memory stays bounded
                return 0
            raw = self.buffer.take()  # rows first: every site and stack id they use is named by now
            names = self.sites.names_since(self._sites_written) if self.sites is not None else []
            st = self.stacks
            frames = st.frames_since(self._frames_written) if st is not None else []
            links = st.stacks_since(self._stacks_written) if st is not None else []
            if not len(raw) and not names and not frames and not links:
                return 0
            batch, n_events = self._batch(raw, names, frames, links)
            self._append(batch.serialize().to_pybytes())
            self._sites_written += len(names)
            self._frames_written += len(frames)
            self._stacks_written += len(links)
            self.events += n_events
            return n_events

    def _batch(self, raw: np.ndarray, names: list[str], frames: list[tuple[str, int, str, int]],
               links: list[tuple[int, int]]) -> tuple[pa.RecordBatch, int]:
        c = unpack(raw)
        t = np.maximum.accumulate(np.maximum(c["t"] - self.t0, self._last_t)) if len(raw) else c["t"]
        if len(t):
            self._last_t = int(t[-1])
        op = c["op"]
        is_note = op == NOTE
        text: list[str | None] = [None] * len(raw)
        for i in np.flatnonzero(is_note):
            text[i] = json.dumps(self.buffer.notes[int(c["addr"][i])], default=str)
        op = np.where(is_note, np.int8(NOTE_ROW), op).astype(np.int8)
        addr = np.where(is_note, 0, c["addr"])
        head = _head_rows(names, self._sites_written, frames, self._frames_written, links,
                          self._stacks_written)
        k = len(head["op"])
        t_head = np.full(k, t[0] if len(t) else self._last_t, np.int64)
        cols = [
            np.concatenate([t_head, t]),
            np.concatenate([head["op"], op]),
            np.concatenate([head["addr"], addr]).astype(np.uint64),
            np.concatenate([head["size"], c["size"]]).astype(np.uint64),
            np.concatenate([np.zeros(k, np.int64), c["rounded"]]).astype(np.uint64),
            np.concatenate([np.zeros(k, np.int64), c["stream"]]).astype(np.uint64),
            np.concatenate([np.zeros(k, np.int16), c["device"]]),
            np.concatenate([head["site"], c["site"]]),
        ]
        arrays = [pa.array(a, type=f.type) for a, f in zip(cols, SPOOL_SCHEMA, strict=False)]
        arrays.append(pa.array(head["text"] + text, type=pa.string()))
        arrays.append(pa.array(np.concatenate([np.full(k, -1, np.int32), c["pool"]]), type=pa.int32()))
        arrays.append(pa.array(np.concatenate([np.full(k, -1, np.int64), c["device_free"]]),
                               type=pa.int64()))
        arrays.append(pa.array(np.concatenate([np.full(k, -1, np.int32), c["stack"]]), type=pa.int32()))
        return pa.RecordBatch.from_arrays(arrays, schema=WRITE_SCHEMA), int(len(raw) - is_note.sum())

    def _warm_up(self) -> None:
        """Build and serialize one batch of every column, here, before the program starts: what Arrow
        and its allocator do once per process (reading /proc and /sys files, starting threads) then
        happens now, not in the flusher beside the program's own calls (see ``held_file``)."""
        raw = np.zeros((1, ROW), np.int64)
        batch, _ = self._batch(raw, ["warm-up"], [("warm-up", 1, "warm-up", 0)], [(0, -1)])
        batch.serialize().to_pybytes()
        self._last_t = 0

    def _append(self, data: bytes) -> None:
        """Append ``data`` to the spool and fsync, through the held descriptor."""
        self._file.write(data)

    def detach(self) -> None:
        """In a forked child: never write (the flusher thread did not survive the fork)."""
        self.pid = -1
        self._thread = None
        self._file.forget()

    def close(self) -> None:
        """Stop the flusher, write what is left and the end-of-stream marker; a failure is kept in
        ``error`` (the spool then ends at its last whole batch), never raised."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.flush()
            if self.error is None and os.getpid() == self.pid:
                self._append(END_OF_STREAM)
        except Exception as e:  # a full disk at the very end: what was written stays recoverable
            self.error = self.error or f"{type(e).__name__}: {e}"
        finally:
            if os.getpid() == self.pid:
                self._file.close()


def _head_rows(names: list[str], site0: int, frames: list[tuple[str, int, str, int]], frame0: int,
               links: list[tuple[int, int]], stack0: int) -> dict[str, Any]:
    """The rows that name what a batch's events use first: call-sites, frames, stacks, in that order
    (columns op, site, addr, size as NumPy; text as a list)."""
    ns, nf, nk = len(names), len(frames), len(links)
    fr = np.array([(ln + 1, kind) for _, ln, _, kind in frames], np.int64).reshape(-1, 2)
    lk = np.array(links, np.int64).reshape(-1, 2)
    return {
        "op": np.concatenate([np.full(ns, SITE_ROW, np.int8), np.full(nf, FRAME_ROW, np.int8),
                              np.full(nk, STACK_ROW, np.int8)]),
        "site": np.concatenate([np.arange(site0, site0 + ns), np.arange(frame0, frame0 + nf),
                                np.arange(stack0, stack0 + nk)]).astype(np.int32),
        "addr": np.concatenate([np.zeros(ns, np.int64), fr[:, 0], lk[:, 0]]),
        "size": np.concatenate([np.zeros(ns, np.int64), fr[:, 1], lk[:, 1] + 1]),
        "text": [*names, *(json.dumps([file, function]) for file, _, function, _ in frames), *([None] * nk)],
    }
