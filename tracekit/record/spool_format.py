"""The spool's file layout (version 4): framed raw rows, read back as record batches.

A recording's spool is written while the program runs by a thread that must not change the
process's address space (``record.spool`` says why), so it holds the hook's rows exactly as the
hook made them, packed by ``struct`` into a buffer allocated before the program started; Arrow
sees them only when the trace is written (or recovered), in this module. Layout::

    MAGIC                                   8 bytes, b"TKSPOOL\\x04"
    frame*                                  each: FRAME header, then ``length`` payload bytes
    FRAME = "<4sIQ"                         tag, count, length (bytes of payload)
      b"META"  count 0    JSON object {"meta": trace metadata, "t0_ns": clock at start}; first
      b"TEXT"  count = records    UTF-8 JSON arrays, one per line (``TextKind``):
               ["s", id, name]                         a call-site's name
               ["f", id, file, line, function, kind]   a frame
               ["k", id, frame, parent]                a stack (parent -1: the outermost)
               ["n", index, {...}]                     a note (the event row before its note row)
      b"ROWS"  count = rows       ``count`` × ``ROW`` little-endian int64: the hook's rows
                                  (``record.hook``: t, code, addr, size, rounded, stream,
                                  device_free, stack; op 15 = a note row, addr = note index)
      b"END\\0" count 0, length 0  the recording ended and everything was written

A TEXT frame comes before the rows that use what it names. A frame cut short (a kill in the
middle of a write, a file truncated) ends the spool there: ``SpoolFrames.truncated``, and
``cut`` says at which byte and frame; a frame the recorder never writes (bytes the program wrote
over the spool: a header of no known kind or length, text that is not its records, rows whose values
``check`` refuses) ends it too, the whole frames before it kept: ``SpoolFrames.damaged`` says at
which byte and frame, and why. Either way the rows after that point come from the tail where it
still holds them (its rows are numbered as the spool's). ``SpoolFrames.batches``
yields the batches of the earlier Arrow spool layout (``WRITE_SCHEMA``, ``record.recover`` reads
both): per ROWS frame, the names, frames and stacks first defined since the last batch, then the
rows, times made relative to ``t0_ns`` and never decreasing, note rows carrying their note's JSON.
A spool is untrusted input: the layout is checked here (tags, lengths, JSON shapes), the values by
``record.recover``.
"""

from __future__ import annotations

import enum
import io
import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa

from tracekit.errors import InputError
from tracekit.inputs import load_json
from tracekit.record.hook import NOTE, ROW, unpack

MAGIC = b"TKSPOOL\x04"
SPOOL_KEY = b"tracekit_spool"  # the schema metadata key of an Arrow spool (recorders before version 4)
FRAME = struct.Struct("<4sIQ")
META, TEXT, ROWS, END = b"META", b"TEXT", b"ROWS", b"END\0"
ROW_BYTES = ROW * 8
MAX_FRAME_BYTES = 1 << 26  # 64 MiB; the writer's frames are at most its buffer (1 MiB)
# An event row's clock reading is the recording's start ``t0_ns`` or later (the hook is entered after
# it): one a second or more before it is bytes the recorder never wrote (zeros, garbage).
EARLY_NS = 1_000_000_000
SITE_ROW, NOTE_ROW, FRAME_ROW, STACK_ROW = -1, -2, -3, -4  # op codes of the batches' named rows

SPOOL_SCHEMA = pa.schema([
    ("t_ns", pa.int64()), ("op", pa.int8()), ("addr", pa.uint64()), ("size", pa.uint64()),
    ("rounded", pa.uint64()), ("stream", pa.uint64()), ("device", pa.int16()), ("site", pa.int32()),
    ("text", pa.string()), ("pool", pa.int32()), ("device_free", pa.int64()),
])
# The columns every spool since version 2 holds (SPOOL_SCHEMA) and what the batches carry: those and
# the request's stack id (-1 none; absent from Arrow spools written before whole stacks).
STACK_FIELD = pa.field("stack", pa.int32())
WRITE_SCHEMA = SPOOL_SCHEMA.append(STACK_FIELD)
# pool: -1 = resolve from the segments when the trace is written; device_free: -1 = not measured.

# Captured when the recorder is imported, before the program runs: a program that replaces json.dumps
# (or breaks the json module) cannot stop the spool from being written.
_DUMPS = json.dumps


class TextKind(enum.StrEnum):
    """The first element of a TEXT record."""

    SITE = "s"
    FRAME = "f"
    STACK = "k"
    NOTE = "n"


def frame_header(tag: bytes, count: int, length: int) -> bytes:
    return FRAME.pack(tag, count, length)


def text_record(kind: TextKind, ident: int, *fields: Any) -> bytes:
    """One TEXT line (``default=str`` so a note's odd values are kept as text, never lost)."""
    return (_DUMPS([str(kind), ident, *fields], default=str) + "\n").encode("utf-8", "surrogatepass")


class SpoolFrames:
    """Reads a version-4 spool: ``meta_json`` and ``t0`` at open, ``batches()`` after."""

    def __init__(self, path: Path, f: IO[bytes], tail: Path | None = None,
                 check: Callable[[Path, pa.RecordBatch], Any] | None = None,
                 head: bytes | None = None) -> None:
        self.path, self._f, self._tail, self._check = path, f, tail, check
        # ``head``: the magic and metadata frame as the recorder wrote them (it, or the watcher, holds
        # them): where the file's own were written over, they are read from it and the frames after it
        # from the file (``head_restored``).
        self.head_restored = False
        if head is not None and f.read(len(head)) != head:
            self.head_restored, self._f = True, io.BytesIO(head)
        else:
            f.seek(0)
        self.truncated = False
        self.cut: str | None = None  # where the spool was cut short (``truncated``)
        self.ended = False
        self.rows_read = 0  # rows of the whole ROWS frames read so far
        self.tail_rows = 0  # rows taken from the tail (``record.tail``) after them
        self.tail_lost = 0  # rows between the spool's last and the tail's first that neither holds
        self.damaged: str | None = None  # where and why the spool stopped making sense (a prefix is kept)
        self.tail_damaged: str | None = None  # where and why the tail's rows stopped making sense
        self._pos = 0  # the byte offset of the frame being read
        self._frame_no = -1  # its number (the metadata frame is frame 0)
        if self._f.read(len(MAGIC)) != MAGIC:
            raise InputError(f"{path}: not a tracekit recording spool")
        frame = self._next()
        if frame is None or frame[0] != META:
            raise InputError(f"{path}: not a tracekit recording spool, or the recording was killed before "
                             "it began")
        head = load_json(frame[2], str(path), "the spool's metadata")
        t0 = head.get("t0_ns") if isinstance(head, dict) else None
        if not (isinstance(head, dict) and isinstance(head.get("meta"), dict) and isinstance(t0, int)
                and not isinstance(t0, bool) and 0 <= t0 < (1 << 62)):
            raise InputError(f"{path}: the spool's metadata is not a JSON object with meta and t0_ns "
                             "(a clock reading in nanoseconds, 0 .. 2^62)")
        self.meta_json: bytes = json.dumps(head["meta"]).encode()
        self.t0: int = head["t0_ns"]
        if self.head_restored:
            self._f = f  # the frames after the metadata: the file's own, from the same offset

    def _next(self) -> tuple[bytes, int, bytes] | None:
        """The next whole frame, or None at the end (``truncated`` where it was cut short, ``damaged``
        where it is not one the recorder writes: the frames before it are kept)."""
        self._pos = self._f.tell()
        self._frame_no += 1
        head = self._f.read(FRAME.size)
        if not head:
            return None
        if len(head) < FRAME.size:
            self._cut(f"a frame header of {len(head)} of {FRAME.size} bytes")
            return None
        tag, count, length = FRAME.unpack(head)
        if tag not in (META, TEXT, ROWS, END):
            self._damage(f"a frame of unknown kind {tag[:4]!r}")
            return None
        if length > MAX_FRAME_BYTES:
            self._damage(f"a frame claims {length:,} bytes (at most {MAX_FRAME_BYTES:,})")
            return None
        payload = self._f.read(length)
        if len(payload) < length:
            self._cut(f"a frame of {len(payload):,} of its {length:,} bytes")
            return None
        if tag == ROWS and length != count * ROW_BYTES:
            self._damage(f"a frame of {count} rows holds {length} bytes, not {count * ROW_BYTES}")
            return None
        return tag, count, payload

    def _where(self) -> str:
        return f"at byte {self._pos:,} (frame {self._frame_no}, after {self.rows_read:,} rows)"

    def _cut(self, what: str) -> None:
        """The spool ends within the frame being read (a kill in the middle of a write, a truncation)."""
        self.truncated = True
        self.cut = f"{self._where()}: {what}, the rest cut off"

    def _damage(self, why: str) -> None:
        """Stop reading at the frame being read: ``damaged`` says where and why (the frames before it
        are whole, and kept; the recorder never writes such a frame, so something else wrote there)."""
        self.damaged = f"{self._where()}: {why}"

    def _checked(self, batch: pa.RecordBatch) -> None:
        if self._check is not None:
            self._check(self.path, batch)

    def _tail_prefix(self, raw: np.ndarray, last_t: int, named: _Named) -> pa.RecordBatch | None:
        """The batch of the tail's longest run of rows from its first that ``check`` accepts (a slot
        the program wrote over ends it; ``tail_damaged`` then says after how many rows)."""
        ok, bad, why = 0, len(raw) + 1, ""  # rows[:ok] pass, rows[:bad] do not
        while bad - ok > 1:
            mid = (ok + bad) // 2 if bad <= len(raw) else len(raw)
            try:
                self._checked(_batch(raw[:mid], self.t0, last_t, _Named(self.path))[0])
                ok = mid
            except InputError as e:
                bad, why = mid, str(e).removeprefix(f"{self.path}: ")
        if ok < len(raw):
            self.tail_damaged = f"after {ok:,} of its {len(raw):,} rows: {why}"
        self.tail_rows = ok
        return _batch(raw[:ok], self.t0, last_t, named)[0] if ok else None

    def batches(self) -> Iterator[pa.RecordBatch]:
        """The spool's batches in the Arrow spool layout (``WRITE_SCHEMA``), one per ROWS frame."""
        named = _Named(self.path)
        last_t = 0
        while (frame := self._next()) is not None:
            tag, _, payload = frame
            if tag == END:
                self.ended = True
                break
            if tag == META:
                self._damage("a second metadata frame")
                break
            if tag == TEXT:
                try:
                    named.read(payload)
                except InputError as e:
                    self._damage(str(e).removeprefix(f"{self.path}: "))
                    break
                continue
            raw = np.frombuffer(payload, "<i8").reshape(-1, ROW).astype(np.int64)
            ev = (raw[:, 1] & 15) != NOTE
            if np.any(raw[ev, 0] < self.t0 - EARLY_NS):  # zeros or garbage: no row precedes the start
                self._damage("an event stamped before the recording began")
                break
            names = named.sites, named.frames, named.stacks
            batch, t = _batch(raw, self.t0, last_t, named)
            try:
                self._checked(batch)
            except InputError as e:  # rows the recorder never writes: written over
                named.sites, named.frames, named.stacks = names  # the tail's rows may use them
                self._damage(str(e).removeprefix(f"{self.path}: "))
                break
            self.rows_read += len(raw)
            last_t = t
            yield batch
        if not self.ended and self._tail is not None:
            # The rows the process made after its last whole spool write, kept in the shared ring.
            # Their notes died with the process (the event rows stay; a call-site or stack first
            # named in those rows reads as none).
            from tracekit.record.tail import read_tail

            raw, self.tail_lost = read_tail(self._tail, self.rows_read)
            raw = raw[(raw[:, 1] & 15) != NOTE]
            if len(raw):
                batch = self._tail_prefix(raw, last_t, named)
                if batch is not None:
                    yield batch
        if named.pending():
            yield _batch(np.zeros((0, ROW), np.int64), self.t0, last_t, named)[0]


class _Named:
    """What TEXT frames defined: names, frames and stacks not yet put in a batch, and every note."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sites: list[tuple[int, str]] = []
        self.frames: list[tuple[int, str, int, str, int]] = []
        self.stacks: list[tuple[int, int, int]] = []
        self.notes: dict[int, str] = {}

    def pending(self) -> bool:
        return bool(self.sites or self.frames or self.stacks)

    def read(self, payload: bytes) -> None:
        """Add a TEXT frame's records: all of them, or (InputError) none."""
        n = len(self.sites), len(self.frames), len(self.stacks)
        notes = set(self.notes)
        try:
            for line in payload.splitlines():
                rec = load_json(line, str(self.path), "a text record in the spool")
                if not (isinstance(rec, list) and len(rec) >= 3 and _ints(rec[1])):
                    raise InputError(f"{self.path}: a text record in the spool is not [kind, id, ...]")
                self._add(rec)
        except InputError:
            del self.sites[n[0]:], self.frames[n[1]:], self.stacks[n[2]:]
            for k in set(self.notes) - notes:
                del self.notes[k]
            raise

    def _add(self, rec: list[Any]) -> None:
        kind, ident, rest = rec[0], rec[1], rec[2:]
        if kind == TextKind.SITE and len(rest) == 1 and isinstance(rest[0], str):
            self.sites.append((ident, rest[0]))
        elif kind == TextKind.FRAME and len(rest) == 4 and _ints(rest[1], rest[3]) \
                and isinstance(rest[0], str) and isinstance(rest[2], str):
            self.frames.append((ident, rest[0], rest[1], rest[2], rest[3]))
        elif kind == TextKind.STACK and len(rest) == 2 and _ints(*rest):
            self.stacks.append((ident, rest[0], rest[1]))
        elif kind == TextKind.NOTE and len(rest) == 1 and isinstance(rest[0], dict):
            self.notes[ident] = json.dumps(rest[0])
        else:
            raise InputError(f"{self.path}: a text record in the spool has kind {str(kind)[:20]!r} "
                             "or fields of the wrong kind")

    def head(self) -> dict[str, Any]:
        """The named rows of the next batch (sites, frames, stacks, in that order), then forgotten."""
        s, f, k = self.sites, self.frames, self.stacks
        self.sites, self.frames, self.stacks = [], [], []
        fr = np.array([(i, ln + 1, kind) for i, _, ln, _, kind in f], np.int64).reshape(-1, 3)
        lk = np.array(k, np.int64).reshape(-1, 3)
        return {
            "op": np.concatenate([np.full(len(s), SITE_ROW, np.int8), np.full(len(f), FRAME_ROW, np.int8),
                                  np.full(len(k), STACK_ROW, np.int8)]),
            "site": np.concatenate([np.array([i for i, _ in s], np.int64), fr[:, 0], lk[:, 0]]),
            "addr": np.concatenate([np.zeros(len(s), np.int64), fr[:, 1], lk[:, 1]]),
            "size": np.concatenate([np.zeros(len(s), np.int64), fr[:, 2], lk[:, 2] + 1]),
            "text": [*(n for _, n in s), *(json.dumps([file, fn]) for _, file, _, fn, _ in f),
                     *([None] * len(k))],
        }


def _ints(*xs: Any) -> bool:
    """Plain ints that fit the batches' int32 id columns (a line number, a kind, an id)."""
    return all(isinstance(x, int) and not isinstance(x, bool) and -(1 << 31) <= x < (1 << 31) for x in xs)


def _batch(raw: np.ndarray, t0: int, last_t: int, named: _Named) -> tuple[pa.RecordBatch, int]:
    """One batch of the Arrow spool layout from raw hook rows; returns it and its last time."""
    c = unpack(raw)
    # t_ns = max(t - t0, every earlier t_ns): threads can stamp a row a little before another
    # thread appends an earlier one, and the trace's time never steps back.
    t = np.maximum.accumulate(np.maximum(c["t"] - t0, last_t)) if len(raw) else c["t"]
    if len(t):
        last_t = int(t[-1])
    is_note = c["op"] == NOTE
    text: list[str | None] = [None] * len(raw)
    for i in np.flatnonzero(is_note):
        text[i] = named.notes.get(int(c["addr"][i]))
    op = np.where(is_note, np.int8(NOTE_ROW), c["op"]).astype(np.int8)
    addr = np.where(is_note, 0, c["addr"])
    head = named.head()
    k = len(head["op"])
    t_head = np.full(k, t[0] if len(t) else last_t, np.int64)
    cols = [
        np.concatenate([t_head, t]),
        np.concatenate([head["op"], op]),
        np.concatenate([head["addr"], addr]).astype(np.uint64),
        np.concatenate([head["size"], c["size"]]).astype(np.uint64),
        np.concatenate([np.zeros(k, np.int64), c["rounded"]]).astype(np.uint64),
        np.concatenate([np.zeros(k, np.int64), c["stream"]]).astype(np.uint64),
        np.concatenate([np.zeros(k, np.int16), c["device"]]),
        np.concatenate([head["site"], c["site"]]).astype(np.int32),
    ]
    arrays = [pa.array(a, type=f.type) for a, f in zip(cols, SPOOL_SCHEMA, strict=False)]
    arrays.append(pa.array(head["text"] + text, type=pa.string()))
    arrays.append(pa.array(np.concatenate([np.full(k, -1, np.int32), c["pool"]]), type=pa.int32()))
    arrays.append(pa.array(np.concatenate([np.full(k, -1, np.int64), c["device_free"]]), type=pa.int64()))
    arrays.append(pa.array(np.concatenate([np.full(k, -1, np.int32), c["stack"]]), type=pa.int32()))
    return pa.RecordBatch.from_arrays(arrays, schema=WRITE_SCHEMA), last_t
