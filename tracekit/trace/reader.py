"""Reading traces (formats 1, 2 and 3), with validation on every read.

Structural faults (not Parquet, truncated, empty, no ``tracekit`` metadata,
a missing or mistyped column, a null size, an unknown op, seq not strictly
increasing, t_ns decreasing, a malloc/free without addr, a stack table that is not one or a
stack id it does not hold, an ``environment`` key that is not a list of folders) raise
``TraceFormatError`` with one sentence naming the file and the column or seq.
Event-level inconsistencies of the malloc/free pairing are dropped and
reported (``Trace.issues``); those of blocks against segments in pooled traces
are kept and reported (``Trace.warnings``, see ``tracekit.trace.containment``);
``strict=True`` turns both into errors. The columns are read in one multi-threaded read
(``tracekit.trace.columns``: one at a time where that read fails, so a bad file fails as it always
did), each handed to NumPy as it is taken so peak memory stays near the size of the result; the
pairing and the per-event checks are one compiled pass (``validate.pair_and_check``). Each ``USER`` frame's
kind is decided again on read (``tracekit.trace.stacks.frame_kind``, with the
trace's ``environment`` folders), so every verb reads one answer to "library or yours".
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.errors import InputError, TraceFormatError
from tracekit.inputs import byte_count, check_regular, load_json, os_cause, safe_text, stat_or_none, utf8_name
from tracekit.trace.ahead import PairingAhead
from tracekit.trace.arrow import array_of, as_numpy, filled, utf8_lengths
from tracekit.trace.columns import Columns, Window, is_text
from tracekit.trace.containment import check_pool
from tracekit.trace.events import Events
from tracekit.trace.finishing import wait_for
from tracekit.trace.pages import MAX_PAGES, PageError, decompressed_bytes
from tracekit.trace.readpass import COMPILED
from tracekit.trace.schema import (
    INT_COLUMNS,
    META_KEY,
    OP_NAMES,
    REQUIRED,
    STACK_FIELD,
    Op,
    TraceMeta,
    op_codes,
)
from tracekit.trace.stacks import META_KEY as STACKS_KEY
from tracekit.trace.stacks import StackTable, from_json, with_kinds
from tracekit.trace.totals import MAX_SIZE, check_ranges, check_totals, over_error, past_end_error
from tracekit.trace.validate import (
    EventIssue,
    Found,
    IssueKind,
    Pairing,
    pair_and_check,
    pass_tables,
    read_only,
    remap_mate,
)


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated trace: metadata, events, the malloc/free pairing and extras.

    ``mate[i]`` is the index of the event paired with event i (-1 if none);
    ``extras`` holds the columns beyond v1 (row-aligned with ``events``);
    ``issues`` lists the inconsistent events that were skipped, ``warnings`` those kept.
    """

    path: Path | None
    meta: TraceMeta
    events: Events
    mate: np.ndarray
    extras: pa.Table | None
    issues: tuple[EventIssue, ...]
    dropped: int = 0
    warnings: tuple[EventIssue, ...] = ()


def open_parquet(path: str | os.PathLike[str]) -> tuple[Path, pq.ParquetFile]:
    """Open ``path`` as Parquet, or raise InputError with a one-sentence cause."""
    p = Path(path)
    # "." or "/" has no name to put a spool beside: the checks below say what it is
    spool = p if p.suffix == ".spool" else p.with_name(p.name + ".spool") if p.name else None
    if p != spool and stat_or_none(p, "trace") is None:
        wait_for(p)  # a recording's watcher may be writing it this moment (tracekit.trace.finishing)
    if spool is not None and _spool_there(spool) and (p == spool or stat_or_none(p, "trace") is None):
        raise InputError(f"{safe_text(p)}: this recording did not finish; run "
                         f"'tracekit recover {safe_text(spool)}' to turn it into a trace")
    if (file_bytes := check_regular(p, "trace").st_size) == 0:
        raise InputError(f"{safe_text(p)}: the file is empty")
    try:
        name = utf8_name(p)  # Arrow keeps an open file for as long as it reads
        pf = pq.ParquetFile(name if name is not None else open(p, "rb"))  # noqa: SIM115
    except (pa.ArrowException, OSError, ValueError) as e:
        if isinstance(e, OSError) and e.errno:  # the file system's refusal, not the content's fault
            raise InputError(f"{safe_text(p)}: cannot read the trace ({os_cause(e)})") from None
        raise InputError(f"{safe_text(p)}: not a readable Parquet file, or it is truncated "
                         f"({os_cause(e)})") from None
    _check_layout(p, pf, file_bytes)
    return p, pf


def _spool_there(spool: Path) -> bool:
    try:  # a spool name too long or unreachable is no spool: the trace's own check says why
        return stat_or_none(spool, "spool") is not None
    except InputError:
        return False


# Reading one column costs a fixed amount per row group, so a file of tiny row groups
# (one row each) would be slow and memory-hungry out of all proportion to its content.
MIN_ROWS_PER_GROUP = 1024
FREE_GROUPS = 4096


# Real traces compress to 2..20 bytes per event; a file that claims far more rows than its
# size (a decompression bomb) would take memory out of all proportion: about 60 bytes per
# event are kept, so this bounds a read to ~4 KB of memory per byte of file beyond 2^20 rows.
ROWS_PER_BYTE = 64
FREE_ROWS = 1 << 20

# Time stamps are nanoseconds: a span of 2^62 ns is 146 years, and differences of times within it
# (durations, gaps) stay inside int64 wherever they are added.
MAX_SPAN_NS = 1 << 62


def _check_layout(p: Path, pf: pq.ParquetFile, file_bytes: int) -> None:
    groups, rows = pf.metadata.num_row_groups, pf.metadata.num_rows
    if rows > FREE_ROWS and rows > ROWS_PER_BYTE * file_bytes:
        raise InputError(f"{p}: {rows:,} rows in {file_bytes:,} bytes, more than {ROWS_PER_BYTE} rows per "
                         "byte; not a trace that was recorded (refused before it is decompressed)")
    if groups > FREE_GROUPS and rows < groups * MIN_ROWS_PER_GROUP:
        raise InputError(
            f"{p}: {groups:,} row groups for {rows:,} rows; rewrite it with row groups of at least "
            f"{MIN_ROWS_PER_GROUP:,} rows (tracekit writes 2^20)"
        )
    names = pf.schema_arrow.names
    if len(names) != len(set(names)):
        dup = next(n for n in names if names.count(n) > 1)
        raise TraceFormatError(f"{p}: column '{dup}' appears more than once")
    for name, ok, want in _EXTRA_TYPES:
        if name in names and not ok(typ := pf.schema_arrow.field(name).type) and not pa.types.is_null(typ):
            raise TraceFormatError(f"{p}: extra column '{name}' has type {typ}, expected {want}")
    _check_text(p, pf, file_bytes)


# Text (call-sites, op names, stacks, any extra string column) is what a small file can inflate
# most: one long value repeated, or many long distinct ones, compress thousands of times. Each text
# column's decompressed size, as the file declares it, is refused beyond TEXT_FREE_BYTES plus
# TEXT_PER_FILE_BYTE bytes per byte of the file, before anything is decompressed; the call-sites
# read are then held to MAX_SITE_BYTES each and MAX_SITES_BYTES together (docs/trace-format.md).
# A call-site costs about 8 times its bytes once analyzed and reported (Python strings, the report's
# labels and tables): 8 MiB of call-sites cost 60-70 MB, measured.
MAX_SITE_BYTES = 16 << 10  # one call-site: a path of PATH_MAX (4 KiB), its line and function, with room
MAX_SITES_BYTES = 8 << 20  # every distinct call-site together: 40,000 sites of 200 bytes
TEXT_FREE_BYTES = 32 << 20
TEXT_PER_FILE_BYTE = 64


def _check_text(p: Path, pf: pq.ParquetFile, file_bytes: int) -> None:
    """InputError when a text column declares more decompressed bytes than the bound above: in the
    footer's metadata, or (a footer can understate it) in its pages' own headers, what Arrow allocates."""
    md = pf.metadata
    text = [c for c in range(md.num_columns)
            if md.schema.column(c).physical_type in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")]
    if not text:
        return
    declared: dict[str, int] = {}
    budget = [MAX_PAGES]
    with open(p, "rb") as f:
        for c in text:
            name = md.schema.column(c).path.split(".")[0]
            declared[name] = declared.get(name, 0) + sum(
                _chunk_text_bytes(p, f, md.row_group(g).column(c), budget) for g in range(md.num_row_groups))
    allowed = TEXT_FREE_BYTES + TEXT_PER_FILE_BYTE * file_bytes
    for name, size in declared.items():
        if size > allowed:
            raise InputError(
                f"{p}: column '{name[:40]}' holds {size:,} bytes of text once decompressed, from a file "
                f"of {file_bytes:,} bytes; more than {TEXT_FREE_BYTES >> 20} MiB plus {TEXT_PER_FILE_BYTE} "
                "bytes per byte of the file is refused (before it is decompressed)")


def _chunk_text_bytes(p: Path, f: BinaryIO, chunk: pq.ColumnChunkMetaData, budget: list[int]) -> int:
    """The larger of a column chunk's declared decompressed size and its pages' (``trace.pages``);
    the declared one alone where the headers cannot be read (Arrow then says the file is damaged)."""
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    try:
        pages = decompressed_bytes(f, int(start or 0), chunk.total_compressed_size, budget)
    except (PageError, OSError, ValueError):
        if budget[0] < 0:
            raise InputError(f"{p}: more than {MAX_PAGES:,} pages of text; not a trace that was "
                             "recorded") from None
        pages = 0
    return max(chunk.total_uncompressed_size, pages)


# The extra columns tracekit reads itself (docs/trace-format.md): their type is checked on open,
# so no consumer meets a string where it counts on a flag or a number.
_EXTRA_TYPES = (
    ("initial", pa.types.is_boolean, "bool"), ("expandable", pa.types.is_boolean, "bool"),
    *((name, pa.types.is_integer, "an integer type")
      for name in ("pool", "device_free", "latency_ns", "input_seq", "free_requested_ns")),
    # v3: stack ids; format 2's `import torch --stacks` wrote each stack as text (still read, as an extra).
    ("stack", lambda t: pa.types.is_integer(t) or is_text(t) or (pa.types.is_dictionary(t)
                                                                   and is_text(t.value_type)),
     "stack ids (an integer type)"),
)


def read_meta(path: str | os.PathLike[str]) -> TraceMeta:
    """Only the metadata (cheap: reads the footer)."""
    p, pf = open_parquet(path)
    try:
        return _meta_of(p, pf)
    finally:
        close_parquet(pf)


def close_parquet(pf: pq.ParquetFile) -> None:
    """Close ``pf`` and its source, also the Python file ``open_parquet`` opens for a name that is
    not UTF-8 (Arrow leaves a file object it was given open, and the collector would close it)."""
    with contextlib.suppress(OSError, pa.ArrowException):
        pf.close(force=True)


def _meta_of(p: Path, pf: pq.ParquetFile) -> TraceMeta:
    raw = (pf.schema_arrow.metadata or {}).get(META_KEY)
    if raw is None:
        raise TraceFormatError(f"{p}: no 'tracekit' metadata; this is not a tracekit trace")
    try:
        d = load_json(raw, str(p), "the 'tracekit' metadata")
    except InputError as e:
        raise TraceFormatError(str(e)) from None
    if not isinstance(d, dict):
        raise TraceFormatError(f"{p}: the 'tracekit' metadata is not a JSON object")
    meta = TraceMeta.from_dict(d, str(p))
    try:  # byte counts in range before any arithmetic uses them
        byte_count(meta.pool_limit_bytes, str(p), "the metadata's pool_limit_bytes")
        if meta.device is not None:
            byte_count(meta.device.total_bytes, str(p), "the metadata's device total_bytes")
            byte_count(meta.device.free_bytes, str(p), "the metadata's device free_bytes")
    except InputError as e:
        raise TraceFormatError(str(e)) from None
    return meta


def read_trace(
    path: str | os.PathLike[str], *, strict: bool = False, extras: bool = True,
    on_window: Callable[[Window], None] | None = None,
) -> Trace:
    """Read and validate a v1 trace. See the module docstring for what is checked. ``on_window``
    is handed each window of rows as it is read, before any check (``columns.Window``; a replay
    started during the read, ``tracekit.sim.head_start``)."""
    p, pf = open_parquet(path)
    try:
        return _read_open(p, pf, strict, extras, on_window)
    finally:
        close_parquet(pf)


def _read_open(p: Path, pf: pq.ParquetFile, strict: bool, extras: bool,
               on_window: Callable[[Window], None] | None = None) -> Trace:
    meta = _meta_of(p, pf)
    schema = pf.schema_arrow
    names = set(schema.names)
    for col in REQUIRED:
        if col not in names and col not in ("site",):
            raise TraceFormatError(f"{p}: missing required column '{col}'")
    stacks = _read_stack_table(p, pf)
    extra_names = [n for n in schema.names if n not in REQUIRED and not _is_stack_ids(schema, n)]
    wanted = extra_names if extras else [n for n in ("expandable", "pool") if n in names]
    ahead = PairingAhead(pf.metadata.num_rows, MAX_REQUEST, MAX_SIZE)  # allocates at its first window

    def window(w: Window) -> None:
        ahead.on_window(w)
        if on_window is not None:
            on_window(w)

    with quick_switches():
        loading = _load_pass()
        try:
            try:
                src = Columns(p, pf, [n for n in schema.names if n in REQUIRED or _is_stack_ids(schema, n)
                                      or n in wanted], [*INT_COLUMNS, STACK_FIELD.name], window)
            finally:
                ahead.stop()  # its rows passed, or (a failed read) the thread ended
            if not COMPILED:
                loading.join()
            ev, pairing, found = _read_events(p, src, schema, stacks, ahead)
            ev = _with_kinds(ev, meta)
            extra_tbl = _read_extras(src, extra_names) if (extras and extra_names) else None
        except MemoryError as e:
            raise _out_of_memory(p, e) from None
        except (pa.ArrowException, OSError) as e:
            raise InputError(f"{p}: the file is damaged or truncated ({e})") from None
    _check_found(p, ev, pairing, found)
    pooled = bool((ev.op == Op.SEGMENT_ALLOC).any())
    try:
        expandable = _extra(src, "expandable", extra_tbl, False) if pooled else None
        pool = _extra(src, "pool", extra_tbl, -1) if pooled else None
    except (pa.ArrowException, OSError) as e:
        raise InputError(f"{p}: the file is damaged or truncated ({e})") from None
    warnings = check_pool(ev.op, ev.addr, ev.size, ev.rounded, ev.device, pairing.keep, pairing.mate,
                          expandable, ev.seq, pool)
    if any(w.kind == IssueKind.ROUNDED_BELOW_SIZE for w in warnings):
        ev = _rounded_at_least_size(ev)
        check_totals(p, ev, pairing.mate, pairing.keep)
    if strict and (pairing.issues or warnings):
        first = (pairing.issues or warnings)[0]
        raise TraceFormatError(f"{p}: inconsistent events (--strict): {first.describe()}")
    dropped = int(len(ev) - np.count_nonzero(pairing.keep))
    mate = pairing.mate
    if dropped:
        mate = remap_mate(pairing.mate, pairing.keep)
        ev = ev.take(pairing.keep)
        if extra_tbl is not None:
            extra_tbl = extra_tbl.filter(array_of(pairing.keep, pa.bool_()))
    return Trace(p, meta, ev, mate, extra_tbl, pairing.issues, dropped, warnings)


# The GIL's switch interval while a trace's columns are read (s; Python's default is 0.005). numba
# loads in a thread beside the read (``_load_pass``), and each step of the read that needs the GIL (a
# window handed over, each column's copy begun and ended: about 300 for 10M events) may otherwise
# wait a whole interval for that thread to let go.
READ_SWITCH_S = 0.0005


@dataclass
class _Reads:
    """The reads under way in this process's threads (``depth``) and the interval before the first."""

    depth: int = 0
    interval: float = 0.0


_READS, _READS_LOCK = _Reads(), threading.Lock()


@contextlib.contextmanager
def quick_switches() -> Iterator[None]:
    """The GIL handed between threads every ``READ_SWITCH_S`` at most; the process's own interval back
    once the last of the reads under way ends (reads in several threads may overlap)."""
    with _READS_LOCK:
        if _READS.depth == 0:
            _READS.interval = sys.getswitchinterval()
            sys.setswitchinterval(min(_READS.interval, READ_SWITCH_S))
        _READS.depth += 1
    try:
        yield
    finally:
        with _READS_LOCK:
            _READS.depth -= 1
            if _READS.depth == 0:
                sys.setswitchinterval(_READS.interval)


def _load_pass() -> threading.Thread:
    """numba and its pass loaded (from numba's cache) in a thread while Arrow reads the file (its reads
    let go of the GIL). Where the reader's pass is numba's (``readpass.COMPILED`` false) the read
    waits for it after the file is in; where the pass is the C one the read does not wait, and the
    verbs' own kernels, which follow the read, find numba loaded or loading (2-core machine: whole
    ``replay`` and ``analyze`` of 10M events 0.1-0.15 s slower where numba began loading only after
    the read)."""

    def load() -> None:
        with contextlib.suppress(Exception):  # anything amiss shows again where the pass is used
            from tracekit.trace._kernels import read_pass

            none = np.zeros(0, np.uint64)  # the types of the real call: one compiled signature
            op, seq, t_ns, addr, size, device = read_only(np.zeros(0, np.int8), none, none.view(np.int64),
                                                          none, none, np.zeros(0, np.int16))
            read_pass(op, seq, t_ns, addr, size, none.copy(), device, *pass_tables(0),
                      np.full(len(Found), -1, np.int64), np.uint64(MAX_REQUEST), np.int64(MAX_SIZE), True)
            from tracekit.trace.live_table import grow, new_table  # the pass's table grows past 2,048 live

            grow(*new_table())

    thread = threading.Thread(target=load, name="tracekit-load-pass", daemon=True)
    thread.start()
    return thread


def _check_found(p: Path, ev: Events, pairing: Pairing, found: np.ndarray) -> None:
    """Refuse ``p`` where the kept events' totals reach 2^62 or a block runs past 2^64 (``totals``),
    from the compiled pass where it could tell, else by the checks of ``totals`` themselves."""
    if any(i.kind == IssueKind.BLOCK_OTHER_DEVICE for i in pairing.issues):  # more dropped since
        check_totals(p, ev, pairing.mate, pairing.keep)
        check_ranges(p, ev, pairing.keep)
        return
    for what in (Found.OVER_LIVE, Found.OVER_RESERVED):
        if found[what] >= 0:
            raise over_error(p, ev, int(found[what]), reserved=what == Found.OVER_RESERVED)
    if found[Found.PAST_END] >= 0:
        raise past_end_error(p, ev, int(found[Found.PAST_END]))


def _with_kinds(ev: Events, meta: TraceMeta) -> Events:
    """``ev`` with its frames' kinds decided as every verb reads them (``stacks.with_kinds``): with
    the folders of the trace's ``environment`` where it has one, by the names alone where not (a trace
    recorded before the key existed, an imported one). Once per read, once per distinct file."""
    folders = meta.environment.folders() if meta.environment is not None else ()
    table = with_kinds(ev.stacks, folders)
    return ev if table is ev.stacks else replace(ev, stacks=table)


def _rounded_at_least_size(ev: Events) -> Events:
    """``ev`` with each request's ``rounded`` raised to its ``size`` where it was below: an allocator
    hands out at least what was asked, so the kept event counts the bytes it must have taken (live
    bytes never below requested ones); the warning still reports the rows."""
    request = (ev.op == Op.MALLOC) | (ev.op == Op.OOM)
    return replace(ev, rounded=np.where(request & (ev.rounded < ev.size), ev.size, ev.rounded))


def _extra(src: Columns, name: str, extra_tbl: pa.Table | None, null: bool | int) -> np.ndarray | None:
    """An extra column (type checked on open) as NumPy, nulls as ``null``; None where the file has none."""
    if name not in src.pf.schema_arrow.names:
        return None
    col = extra_tbl.column(name) if extra_tbl is not None else src.get(name)
    if pa.types.is_null(col.type):
        return None
    out = filled(col, False if isinstance(null, bool) else 0).astype(
        np.bool_ if isinstance(null, bool) else np.int64, copy=False)
    if col.null_count and null:
        out = out if out.flags.writeable else out.copy()
        out[filled(col.is_null())] = null
    return out


def _is_stack_ids(schema: pa.Schema, name: str) -> bool:
    """``name`` is v3's ``stack`` column (integers, or all null), not format 2's text extra."""
    typ = schema.field(name).type
    return name == STACK_FIELD.name and (pa.types.is_integer(typ) or pa.types.is_null(typ))


def _read_stack_table(p: Path, pf: pq.ParquetFile) -> StackTable | None:
    """The ``tracekit.stacks`` table, checked (``stacks.from_json``); None where the file has none.
    Its JSON lives in the file's footer, so what it holds is bounded by the file's size (and by
    ``load_json``'s bound), and ``from_json`` bounds what that unfolds into."""
    raw = (pf.metadata.metadata or {}).get(STACKS_KEY)  # the file's key-value metadata: written on close
    if raw is None:
        return None
    try:
        obj = load_json(raw, str(p), "the 'tracekit.stacks' metadata")
    except InputError as e:
        raise TraceFormatError(str(e)) from None
    try:
        return from_json(obj)
    except ValueError as e:
        raise TraceFormatError(f"{p}: the 'tracekit.stacks' metadata is not a stack table: {e}") from None


def _read_stack(src: Columns, table: StackTable | None, seq: np.ndarray) -> np.ndarray | None:
    """The ``stack`` column as int32 ids (null: -1), each checked against ``table``; None where no
    event has a stack: formats 1 and 2, and a file of format 3 whose column was dropped or nulled
    with its ``tracekit.stacks`` key kept (a tool that rewrote the file); the call-sites, which the
    ``site`` column still holds, then stand as one-frame stacks."""
    p, schema = src.path, src.pf.schema_arrow
    there = STACK_FIELD.name in schema.names and _is_stack_ids(schema, STACK_FIELD.name)
    if not there or pa.types.is_null(schema.field(STACK_FIELD.name).type):
        return None
    # Nulls are filled with 0 and marked -1 after the check: an unsigned column (polars may write
    # valid ids as uint32/uint64) holds no -1, and its values are compared in its own type, so none
    # wraps before it is checked.
    ids, null = src.ints(STACK_FIELD.name)
    n_stacks = table.n_stacks if table is not None else 0
    bad = ids >= n_stacks
    if ids.dtype.kind == "i":
        bad |= ids < -1
    if null is not None:  # a null's 0 is no id (every row of a file without stacks' table)
        bad &= ~null
    i = int(bad.argmax()) if len(bad) else 0  # the first bad row, where there is one
    if len(bad) and bad[i]:
        held = (f"the 'tracekit.stacks' table holds {n_stacks:,}" if table is not None
                else "the file has no 'tracekit.stacks' metadata")
        raise TraceFormatError(f"{p}: column 'stack' names stack {int(ids[i])} at seq {int(seq[i])}, "
                               f"but {held}")
    if null is None:
        out = ids.astype(np.int32, copy=False)  # every id checked in range: none wraps
    else:  # ids is as_numpy's own copy where there are nulls (0 there): written in place when int32
        out = ids if ids.dtype == np.int32 else ids.astype(np.int32)
        out -= null  # -1 where null (a subtraction: NumPy's masked assignment is five times slower)
    return out if bool((out >= 0).any()) else None


def _read_events(p: Path, src: Columns, schema: pa.Schema, stacks: StackTable | None,
                 ahead: PairingAhead) -> tuple[Events, Pairing, np.ndarray]:
    """The events, checked; their pairing; and per ``Found`` the first event with that fault, of
    the faults raised once the extras are read (``_check_found``)."""
    cols: dict[str, np.ndarray] = {}
    n = src.pf.metadata.num_rows
    op = _read_op(src)
    for name, dtype in INT_COLUMNS.items():
        typ = schema.field(name).type
        if not pa.types.is_integer(typ):
            raise TraceFormatError(f"{p}: column '{name}' has type {typ}, expected an integer type")
        values, null = src.ints(name)
        if null is not None:
            _check_nulls(p, name, null, op, cols.get("seq"))
        cols[name] = _to_numpy(p, name, values, dtype)
    if not cols["rounded"].flags.writeable:  # Arrow's own memory: the pass fills unknown roundings
        cols["rounded"] = cols["rounded"].copy()
    c = cols
    # One compiled pass: the pairing, and the checks below by the first event that fails each. An
    # unknown rounding (null, or 0) falls back to the requested size there.
    # Made during the read where it could be (``tracekit.trace.ahead``): the same answer.
    made = ahead.result(op, cols, c["addr"], c["size"])
    pairing, found = made if made is not None else pair_and_check(
        op, c["seq"], c["t_ns"], c["addr"], c["size"], c["rounded"], c["device"], MAX_REQUEST, MAX_SIZE)
    seq = cols["seq"]
    if (i := int(found[Found.BIG_REQUEST])) >= 0:  # room for an allocator's rounding (at most doubling)
        raise TraceFormatError(f"{p}: a request of {int(cols['size'][i])} bytes at seq "
                               f"{int(seq[i])}; requests must be below 2^60 bytes")
    if (i := int(found[Found.SEQ_BACK])) >= 0:  # compared, not subtracted: a difference can overflow
        raise TraceFormatError(f"{p}: seq is not strictly increasing at seq {int(seq[i])} "
                               f"(after {int(seq[i - 1])})")
    if (i := int(found[Found.T_BACK])) >= 0:
        raise TraceFormatError(f"{p}: t_ns decreases at seq {int(seq[i])}")
    if n > 1 and int(cols["t_ns"][-1]) - int(cols["t_ns"][0]) >= MAX_SPAN_NS:  # Python ints: no overflow
        raise TraceFormatError(f"{p}: t_ns spans 2^62 ns (146 years) or more, from "
                               f"{int(cols['t_ns'][0])} to {int(cols['t_ns'][-1])}; not a recording")
    site, sites = _read_site(src, schema, n)
    stack = _read_stack(src, stacks, seq)
    if stack is None or stacks is None:  # no event has a stack: the call-sites as one-frame stacks
        ev = Events(c["seq"], c["t_ns"], op, c["addr"], c["size"], c["rounded"], c["stream"], c["device"],
                    site, sites)
    else:
        ev = Events(c["seq"], c["t_ns"], op, c["addr"], c["size"], c["rounded"], c["stream"], c["device"],
                    site, sites, stack, stacks)
    return ev, pairing, found


def _check_nulls(p: Path, name: str, null: np.ndarray, op: np.ndarray, seq: np.ndarray | None) -> None:
    """Refuse a null where column ``name`` may hold none (``seq``: the column, read before the others)."""
    if name == "addr":
        bad = null & (op != Op.OOM)
        what = "addr"
    elif name == "rounded":
        return  # rounded may be unknown; readers fall back to size below
    else:
        bad = null
        what = name
    idx = np.flatnonzero(bad)
    if len(idx) and (name == "seq" or seq is None):
        raise TraceFormatError(f"{p}: missing seq in row {int(idx[0])}")
    if len(idx):
        assert seq is not None
        raise TraceFormatError(
            f"{p}: missing {what} at seq {int(seq[idx[0]])} ({OP_NAMES[op[idx[0]]]} row)"
        )


MAX_REQUEST = 1 << 60


def _to_numpy(p: Path, name: str, out: np.ndarray, dtype: type) -> np.ndarray:
    """Column ``name`` (as ``as_numpy`` gave it, in the file's type) in the format's type ``dtype``,
    every value checked to fit it."""
    if len(out) and out.dtype != np.dtype(dtype):
        info = np.iinfo(dtype)
        lo, hi = out.min(), out.max()
        if lo < info.min or hi > info.max:
            bad = int(lo) if lo < info.min else int(hi)
            raise TraceFormatError(
                f"{p}: column '{name}' holds {bad}, outside the {np.dtype(dtype)} range of the format"
            )
    out = out.astype(dtype, copy=False)
    if name in ("size", "rounded") and len(out) and out.max() >= MAX_SIZE:
        raise TraceFormatError(f"{p}: column '{name}' holds {int(out.max())} bytes, beyond any device")
    return out


def _read_op(src: Columns) -> np.ndarray:
    p = src.path
    dictionary, idx = _text_dictionary(src, "op")
    names = dictionary.to_pylist()
    # One slot per dictionary entry plus a last one for nulls: -1 unknown, -2 null.
    lut = np.append(op_codes(names), np.int8(-2))
    index, _ = as_numpy(idx, len(names))
    codes = lut[index]
    bad = np.flatnonzero(codes < 0)
    if len(bad):
        i = int(bad[0])
        seq = int(src.get("seq").to_numpy()[i])
        if codes[i] == -2:
            raise TraceFormatError(f"{p}: missing op at seq {seq}")
        name = names[int(index[i])]
        raise TraceFormatError(
            f"{p}: unknown op {name[:40]!r} at seq {seq} (expected one of {', '.join(OP_NAMES)})"
        )
    return codes


def _read_site(src: Columns, schema: pa.Schema, n: int) -> tuple[np.ndarray, tuple[str, ...]]:
    if "site" not in schema.names or pa.types.is_null(schema.field("site").type):
        return np.full(n, -1, dtype=np.int32), ()
    merged, idx = _text_dictionary(src, "site")
    _check_sites(src.path, merged)
    site, _ = as_numpy(idx, -1)
    return site.astype(np.int32, copy=False), tuple(merged.to_pylist())


def _check_sites(p: Path, sites: pa.Array) -> None:
    """TraceFormatError when one distinct call-site is longer than MAX_SITE_BYTES, or all of them
    together more than MAX_SITES_BYTES (UTF-8 bytes), before they become Python strings."""
    if not len(sites):
        return
    lengths = utf8_lengths(sites)
    longest, total = int(lengths.max()), int(lengths.sum())
    if longest > MAX_SITE_BYTES:
        raise TraceFormatError(f"{p}: a call-site of {longest:,} bytes; call-sites are refused beyond "
                               f"{MAX_SITE_BYTES:,} bytes each")
    if total > MAX_SITES_BYTES:
        raise TraceFormatError(f"{p}: {len(sites):,} distinct call-sites of {total:,} bytes together; "
                               f"call-sites are refused beyond {MAX_SITES_BYTES:,} bytes in all")


def _text_dictionary(src: Columns, name: str) -> tuple[pa.Array, pa.ChunkedArray]:
    """A string column as (its distinct values, an index per row), the values decoded once."""
    col = src.take(name)
    typ = col.type
    if not (pa.types.is_dictionary(typ) and is_text(typ.value_type)):
        declared = src.pf.schema_arrow.field(name).type
        raise TraceFormatError(f"{src.path}: column '{name}' has type {declared}, expected strings")
    col = col.unify_dictionaries()
    values = col.chunks[0].dictionary if col.num_chunks else pa.array([], pa.string())
    return values, pa.chunked_array([c.indices for c in col.chunks], type=typ.index_type)


def _read_extras(src: Columns, names: list[str]) -> pa.Table:
    """The extra columns, string columns as dictionaries (``columns.text_column``)."""
    return pa.table({name: src.take(name) for name in names})


def _out_of_memory(p: Path, e: MemoryError) -> InputError:
    """The one sentence for running out of memory while reading: the machine or a limit, not the file."""
    cause = str(e).splitlines()[0] if str(e) else "MemoryError"
    return InputError(f"{p}: reading it ran out of memory ({cause}); a memory limit (ulimit, a "
                      "container) or the machine leaves too little for it")
