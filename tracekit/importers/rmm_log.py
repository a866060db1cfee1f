"""Import an RMM allocation log (``logging_resource_adaptor``'s CSV) as a v3 trace.

The format, from RMM's own source (rapidsai/rmm): ``logging_resource_adaptor_impl.cpp`` writes the
header ``Thread,Time,Action,Pointer,Size,Stream`` once, then one line per call under the logger
pattern ``%t,%H:%M:%S.%f,%v``: the OS thread id (decimal), the local time of day to the microsecond,
and ``allocate,%p,%zu,<stream>`` / ``free,%p,%zu,<stream>`` / ``allocate failure,%p,%zu,<stream>``
(the pointer printed by ``%p``: ``0x...``, ``(nil)`` for a null pointer; the size the caller's
bytes, unaligned; the stream ``std::hex`` of the ``cudaStream_t``, ``rmm/detail/format.hpp``).
RMM's replay benchmark reads the same columns (``cpp/benchmarks/utilities/log_parser.hpp``:
hex pointers, ``(nil)`` as 0). Python's ``rmm.reinitialize(logging=True, log_file_name=F)`` writes
one file per device, ``F`` with ``.dev<N>`` before its extension (``_append_id``).

Mapping, row by row in file order: ``allocate`` -> ``malloc`` (``addr`` the pointer, ``size`` the
logged bytes, ``rounded`` those bytes aligned up to ``rmm::CUDA_ALLOCATION_ALIGNMENT``, 256);
``free`` -> ``free`` (``size`` the logged bytes aligned up to 256: the block's bytes in RMM's
pools); ``allocate failure`` -> ``oom`` (``size`` the request, ``rounded`` aligned). ``Stream`` ->
``stream``, ``Thread`` -> the extra column ``thread`` (uint64), the device from the file name
(``.dev<N>``; 0 without one). ``t_ns`` is the time of day less the first row's, a step back of more
than 12 hours read as midnight passing, and smaller steps back (threads logging at once) clamped to
the row before. ``allocate``/``free`` rows with a null pointer (RMM answers a request of 0 bytes with
nullptr and frees it as a no-op) make no row; they are counted in the metadata (``rmm_import``).

Reading: Arrow's streaming CSV reader splits the file into string columns, block by block, and one
compiled pass per block (``_parse``) checks and converts every field, so no Python object is made
per row and the memory held is one block of text plus the converted columns (41 bytes per row), and the trace
built from them (10 million rows, 545 MB of log: 8 s and 1.7 GB at the peak on a 2-core machine).
A malformed log is refused with one sentence naming the file, the line and the field.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
from numba import njit

from tracekit.errors import InputError
from tracekit.inputs import check_regular, os_cause, safe_text, utf8_name
from tracekit.outputs import check_output
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.totals import first_past_end

HEADER = ("Thread", "Time", "Action", "Pointer", "Size", "Stream")
ALIGNMENT = 256  # rmm::CUDA_ALLOCATION_ALIGNMENT (rmm/aligned.hpp)
MAX_REQUEST = 1 << 60  # the input policy's bound on a request (docs/trace-format.md)
DAY_NS = 86_400 * 10**9
BLOCK_BYTES = 16 << 20  # text per block the CSV reader hands over
_DEVICE = re.compile(r"\.dev(\d{1,5})(\.[^.]*)?$")


class Action(IntEnum):
    """The ``Action`` column's values (``log_parser.hpp``'s ``action``)."""

    ALLOCATE = 0
    FREE = 1
    ALLOCATE_FAILURE = 2


_OP_OF_ACTION = np.array([Op.MALLOC, Op.FREE, Op.OOM], np.int8)


class Field(IntEnum):
    """A column of the log, in header order (what a malformed line is blamed on)."""

    THREAD = 0
    TIME = 1
    ACTION = 2
    POINTER = 3
    SIZE = 4
    STREAM = 5


_EXPECTED = {
    Field.THREAD: "a thread id (decimal)",
    Field.TIME: "a time of day HH:MM:SS.ffffff",
    Field.ACTION: "'allocate', 'free' or 'allocate failure'",
    Field.POINTER: "a hex pointer such as 0x7f2a00000000 or (nil)",
    Field.SIZE: "a byte count below 2^60",
    Field.STREAM: "a hex stream handle such as 0x1 or 0",
}


class ImportInfoJSON(TypedDict):
    """The ``rmm_import`` metadata key."""

    log: str  # the log's file name
    rows: int  # data lines read
    null_pointer_rows: int  # allocate/free lines with a null pointer (0-byte requests): no row
    time: str  # what t_ns is made of
    time_steps_back: int  # rows whose time of day stepped back (clamped to the row before)
    midnights: int  # times the time of day wrapped past midnight
    threads: int  # distinct thread ids
    device_from_name: bool  # the device ordinal came from a ``.dev<N>`` file name


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote: the path, the rows written, the device, null-pointer lines skipped."""

    path: Path
    rows: int
    device: int
    null_pointer_rows: int


def default_output(log: Path) -> Path:
    """The log's path with its last suffix (``.csv``, ``.log``, ``.txt``) replaced by ``.parquet``."""
    name = log.name
    for suffix in (".csv", ".log", ".txt"):
        if name.endswith(suffix) and len(name) > len(suffix):
            return log.with_name(name[: -len(suffix)] + ".parquet")
    return log.with_name(name + ".parquet")


def device_of(log: Path) -> int | None:
    """The device ordinal of an RMM log's name (``rmm_log.dev1.csv`` -> 1), None without ``.dev<N>``."""
    m = _DEVICE.search(log.name)
    return int(m.group(1)) if m and int(m.group(1)) < 32768 else None


# -- the compiled field parsers: each returns the value and whether the text was well formed --------


@njit(cache=True, inline="always")
def _decimal(d, lo, hi):  # pragma: no cover - compiled
    """Unsigned decimal in d[lo:hi]; (value, ok). At most 19 digits (below 10^19 < 2^64)."""
    if hi <= lo or hi - lo > 19:
        return np.uint64(0), False
    v = np.uint64(0)
    for k in range(lo, hi):
        c = d[k]
        if c < 48 or c > 57:
            return np.uint64(0), False
        v = v * np.uint64(10) + np.uint64(c - 48)
    return v, True


@njit(cache=True, inline="always")
def _hex(d, lo, hi, nil_ok):  # pragma: no cover - compiled
    """Hex in d[lo:hi], ``0x`` optional, at most 16 digits; ``(nil)`` is 0 when ``nil_ok``."""
    if nil_ok and hi - lo == 5 and d[lo] == 40 and d[lo + 1] == 110 and d[lo + 2] == 105 \
            and d[lo + 3] == 108 and d[lo + 4] == 41:
        return np.uint64(0), True
    if hi - lo >= 2 and d[lo] == 48 and (d[lo + 1] == 120 or d[lo + 1] == 88):
        lo += 2
    if hi <= lo or hi - lo > 16:
        return np.uint64(0), False
    v = np.uint64(0)
    for k in range(lo, hi):
        c = d[k]
        if 48 <= c <= 57:
            x = c - 48
        elif 97 <= c <= 102:
            x = c - 87
        elif 65 <= c <= 70:
            x = c - 55
        else:
            return np.uint64(0), False
        v = (v << np.uint64(4)) | np.uint64(x)
    return v, True


@njit(cache=True, inline="always")
def _two(d, k):  # pragma: no cover - compiled
    a = d[k] - 48
    b = d[k + 1] - 48
    if a < 0 or a > 9 or b < 0 or b > 9:
        return -1
    return a * 10 + b


@njit(cache=True, inline="always")
def _time(d, lo, hi):  # pragma: no cover - compiled
    """``H:MM:SS.f`` (1-2 hour digits, 1-9 fraction digits) in d[lo:hi] as ns of the day; -1 if bad."""
    n = hi - lo
    h0 = 2 if n >= 2 and d[lo + 1] != 58 else 1  # ':' is 58
    if n < h0 + 8:
        return -1
    h = d[lo] - 48 if h0 == 1 else _two(d, lo)
    if h < 0 or h > 23 or d[lo + h0] != 58 or d[lo + h0 + 3] != 58 or d[lo + h0 + 6] != 46:
        return -1
    m = _two(d, lo + h0 + 1)
    s = _two(d, lo + h0 + 4)
    if m < 0 or m > 59 or s < 0 or s > 60:
        return -1
    f0 = lo + h0 + 7
    nf = hi - f0
    if nf < 1 or nf > 9:
        return -1
    frac = 0
    for k in range(f0, hi):
        c = d[k] - 48
        if c < 0 or c > 9:
            return -1
        frac = frac * 10 + c
    for _ in range(nf, 9):
        frac *= 10
    return ((h * 60 + m) * 60 + s) * 1_000_000_000 + frac


@njit(cache=True, inline="always")
def _action(d, lo, hi):  # pragma: no cover - compiled
    """The ``Action`` code of d[lo:hi], -1 for anything else."""
    n = hi - lo
    if n == 4 and d[lo] == 102 and d[lo + 1] == 114 and d[lo + 2] == 101 and d[lo + 3] == 101:
        return Action.FREE
    if n != 8 and n != 16:
        return -1
    word = "allocate failure"
    for k in range(n):
        if d[lo + k] != ord(word[k]):
            return -1
    return Action.ALLOCATE if n == 8 else Action.ALLOCATE_FAILURE


@njit(cache=True)
def _parse(o0, d0, o1, d1, o2, d2, o3, d3, o4, d4, o5, d5, thread, t_ns, action, pointer, size,
           stream):  # pragma: no cover - compiled
    """Convert one block's string columns (Arrow offsets ``o*`` into bytes ``d*``, header order) into
    the output arrays; returns (row, Field) of the first malformed field, or (-1, -1)."""
    n = thread.shape[0]
    for i in range(n):
        v, ok = _decimal(d0, o0[i], o0[i + 1])
        if not ok:
            return i, Field.THREAD
        thread[i] = v
        t = _time(d1, o1[i], o1[i + 1])
        if t < 0:
            return i, Field.TIME
        t_ns[i] = t
        a = _action(d2, o2[i], o2[i + 1])
        if a < 0:
            return i, Field.ACTION
        action[i] = a
        v, ok = _hex(d3, o3[i], o3[i + 1], True)
        if not ok:
            return i, Field.POINTER
        pointer[i] = v
        v, ok = _decimal(d4, o4[i], o4[i + 1])
        if not ok or v >= np.uint64(MAX_REQUEST):
            return i, Field.SIZE
        size[i] = v
        v, ok = _hex(d5, o5[i], o5[i + 1], True)
        if not ok:
            return i, Field.STREAM
        stream[i] = v
    return -1, -1


def _buffers(col: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The offsets (int64, length n + 1) and bytes of a string column, no copy of the text."""
    if col.null_count:  # the reader makes no nulls of strings; a guard for the offsets' meaning
        col = col.fill_null("")
    _, offs, data = col.buffers()
    offsets = np.frombuffer(offs, np.int32, len(col) + 1, col.offset * 4).astype(np.int64)
    text = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets, text


@dataclass(frozen=True, eq=False)
class LogColumns:
    thread: np.ndarray  # uint64
    t_ns: np.ndarray  # int64, ns of the day
    action: np.ndarray  # int8, ``Action``
    pointer: np.ndarray  # uint64
    size: np.ndarray  # uint64
    stream: np.ndarray  # uint64


class _BadRow:
    """The first line Arrow's reader found with the wrong number of fields (its physical number)."""

    def __init__(self) -> None:
        self.line = -1
        self.fields = 0

    def __call__(self, row: pcsv.InvalidRow) -> str:
        if self.line < 0:
            self.line = row.number if row.number is not None and row.number >= 0 else 0
            self.fields = row.actual_columns
        return "skip"

    def error(self, where: str) -> InputError:
        return InputError(f"{where}: line {self.line}: expected the {len(HEADER)} fields {','.join(HEADER)}, "
                          f"got {self.fields}")

    def learn(self, e: BaseException) -> bool:
        """Arrow's own "Row #N: Expected a columns, got b" for a row it could not hand to the handler
        (its text is not UTF-8: Arrow fails to decode it before calling): True where it was that."""
        m = _ROW_COUNT.search(str(e))
        if m is None:
            return False
        if self.line < 0:
            self.line, self.fields = int(m.group(1)), int(m.group(2))
        return True

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        """While reading: Arrow reports its own failure to decode a bad row's text for the handler
        as an unraisable exception (a traceback on stderr); that row's error is ``learn``'s."""
        before = sys.unraisablehook

        def hook(u: Any) -> None:
            if u.object is not self:
                before(u)

        sys.unraisablehook = hook
        try:
            yield
        finally:
            sys.unraisablehook = before


def _has_header(path: Path) -> bool:
    """The file's first line is an RMM log's header (a bad row's line number is then the log's)."""
    try:
        with open(path, "rb") as f:
            return f.readline(4096).rstrip(b"\r\n") == ",".join(HEADER).encode()
    except OSError:
        return False


_ROW_COUNT = re.compile(r"Row #(\d+): Expected \d+ columns, got (\d+)")


def read_log(path: Path) -> LogColumns:
    """Every data line of the log at ``path`` converted (InputError naming the line otherwise)."""
    bad = _BadRow()
    with bad.quiet():
        return _read_log(path, bad)


def _read_log(path: Path, bad: _BadRow) -> LogColumns:
    where = safe_text(path)
    name = utf8_name(path)
    try:
        source: str | pa.NativeFile = name if name is not None else pa.OSFile(os.fsencode(path))
    except OSError as e:
        raise InputError(f"{where}: cannot read the RMM log ({os_cause(e)})") from None
    try:
        reader = pcsv.open_csv(
            source,
            read_options=pcsv.ReadOptions(block_size=BLOCK_BYTES, use_threads=False),
            parse_options=pcsv.ParseOptions(quote_char=False, ignore_empty_lines=False,
                                            invalid_row_handler=bad),
            # bytes that are not UTF-8 reach the field parsers, which refuse them with their line
            convert_options=pcsv.ConvertOptions(column_types={h: pa.string() for h in HEADER},
                                                check_utf8=False, strings_can_be_null=False,
                                                quoted_strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        if _has_header(path) and bad.learn(e):  # the first block's bad row, its text not UTF-8
            raise bad.error(where) from None
        raise InputError(f"{where}: line 1: not an RMM log ({_arrow_cause(e)})") from None
    except OSError as e:
        raise InputError(f"{where}: cannot read the RMM log ({os_cause(e)})") from None
    try:
        names = tuple(reader.schema.names)
    except UnicodeDecodeError:
        names = ("(not UTF-8 text)",)
    if names != HEADER:
        raise InputError(f"{where}: line 1: not an RMM log header (expected {','.join(HEADER)!r}, "
                         f"got {safe_text(','.join(names)[:120])!r})")
    parts: list[LogColumns] = []
    rows = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        except pa.ArrowInvalid as e:  # not UTF-8, a line past Arrow's limits
            if bad.learn(e):
                raise bad.error(where) from None
            raise InputError(f"{where}: after line {rows + 1}: not an RMM log ({_arrow_cause(e)})") from None
        except OSError as e:
            raise InputError(f"{where}: cannot read the RMM log ({os_cause(e)})") from None
        n = batch.num_rows
        cols = LogColumns(np.empty(n, np.uint64), np.empty(n, np.int64), np.empty(n, np.int8),
                        np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty(n, np.uint64))
        (o0, d0), (o1, d1), (o2, d2), (o3, d3), (o4, d4), (o5, d5) = (_buffers(c) for c in batch.columns)
        row, field = _parse(o0, d0, o1, d1, o2, d2, o3, d3, o4, d4, o5, d5, cols.thread, cols.t_ns,
                            cols.action, cols.pointer, cols.size, cols.stream)
        line = rows + row + 2  # the header is line 1; no line was skipped before the first bad one
        if bad.line >= 0 and (row < 0 or bad.line <= line):
            raise bad.error(where)
        if row >= 0:
            f = Field(field)
            cell = batch.column(int(f))[row].as_buffer()
            text = cell.to_pybytes().decode("utf-8", "replace") if cell is not None else ""
            raise InputError(f"{where}: line {line}: the {HEADER[f]} field {safe_text(text[:80])!r} is not "
                             f"{_EXPECTED[f]}")
        parts.append(cols)
        rows += n
    if bad.line >= 0:
        raise bad.error(where)
    if not parts:
        return LogColumns(*(np.zeros(0, t) for t in (np.uint64, np.int64, np.int8, np.uint64, np.uint64,
                                                    np.uint64)))
    names = ("thread", "t_ns", "action", "pointer", "size", "stream")
    blocks = {name: [getattr(p, name) for p in parts] for name in names}
    del parts
    joined: dict[str, np.ndarray] = {}
    for name in names:  # one column at a time: its blocks go as it is joined
        joined[name] = np.concatenate(blocks.pop(name))
    return LogColumns(**joined)


def _arrow_cause(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return safe_text(text[:160])


def _times(t_day: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Time of day (ns) -> ns since the first row, non-decreasing; (t_ns, steps back, midnights)."""
    if len(t_day) == 0:
        return t_day, 0, 0
    step = np.diff(t_day)
    wrap = step < -DAY_NS // 2
    days = np.concatenate(([0], np.cumsum(wrap, dtype=np.int64)))
    t = t_day + days * DAY_NS - t_day[0]
    back = int(np.count_nonzero(np.diff(t) < 0))
    return np.maximum.accumulate(t), back, int(wrap.sum())


def _align(x: np.ndarray) -> np.ndarray:
    a = np.uint64(ALIGNMENT - 1)
    return (x + a) & ~a


@dataclass(frozen=True, eq=False)
class Converted:
    """A log as a trace in memory: metadata, events and the ``thread`` extra column."""

    meta: TraceMeta
    events: Events
    extras: dict[str, pa.Array]
    null_pointer_rows: int


def log_events(cols: LogColumns, device: int, t_ns: np.ndarray) -> tuple[Events, np.ndarray, np.ndarray]:
    """The trace rows of a read log on ``device`` at the times ``t_ns`` (one per line, ns): (events,
    their ``thread`` column, the mask of the lines kept). Null-pointer ``allocate``/``free`` lines
    (0-byte requests) make no row."""
    keep = ~((cols.pointer == 0) & (cols.action != Action.ALLOCATE_FAILURE))
    op = _OP_OF_ACTION[cols.action[keep]]
    size = cols.size[keep]
    aligned = _align(size)
    is_free = op == Op.FREE
    ev = Events.build(
        op=op, size=np.where(is_free, aligned, size), addr=np.where(op == Op.OOM, 0, cols.pointer[keep]),
        rounded=np.where(is_free, 0, aligned), t_ns=t_ns[keep], stream=cols.stream[keep],
        device=np.full(len(op), device, np.int16),
    )
    return ev, cols.thread[keep], keep


def convert(cols: LogColumns, where: Path, device: int) -> Converted:
    """The trace of a read log (``read_log``) on ``device``."""
    t_ns, back, midnights = _times(cols.t_ns)
    ev, thread, keep = log_events(cols, device, t_ns)
    # A block that would run past the end of the address space: no reader would take the trace
    past = first_past_end(ev, np.ones(len(ev), bool))
    if past is not None:
        line = int(np.flatnonzero(keep)[past]) + 2  # the header is line 1
        raise InputError(f"{safe_text(where)}: line {line}: a block of {int(ev.rounded[past])} bytes at "
                         f"{hex(int(ev.addr[past]))} would run past the end of the 64-bit address space")
    nulls = len(keep) - len(ev)
    info = ImportInfoJSON(
        log=where.name, rows=len(cols.action), null_pointer_rows=nulls,
        time="time of day to the microsecond, less the first row's (RMM logs carry no date)",
        time_steps_back=back, midnights=midnights, threads=int(len(np.unique(thread))),
        device_from_name=device_of(where) is not None,
    )
    meta = TraceMeta.new(Source.RMM, extra={"rmm_import": dict(info)})
    return Converted(meta, ev, {"thread": pa.array(thread, pa.uint64())}, nulls)


def import_log(path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *,
               device: int | None = None, force: bool = False) -> ImportResult:
    """Read the RMM log at ``path`` and write its trace (``output``, or beside the log).

    ``device`` overrides the ordinal the file name gives (``.dev<N>``; 0 without one). An existing
    ``output`` is refused (OutputError) unless ``force``; the log itself never is.
    """
    src = Path(path)
    check_regular(src, "RMM log")  # before anything opens it: a named pipe would block forever
    out = Path(output) if output is not None else default_output(src)
    check_output(out, (src,), force=force)
    dev = device if device is not None else (device_of(src) or 0)
    c = convert(read_log(src), src, dev)
    write_trace(out, c.meta, c.events, c.extras)
    return ImportResult(out, len(c.events), dev, c.null_pointer_rows)
