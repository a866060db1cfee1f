"""A trace's columns read at once, the integer columns copied into whole-file NumPy arrays.

``Columns`` reads every column a reader needs at once, in multi-threaded Parquet reads of a window
of row groups each (text columns as dictionaries, ``text_column``), the integer columns copied from
each window straight into their whole-file NumPy arrays while the next window is read (a thread
of its own; the columns' copies in parallel where there are cores, ``_copiers``), so memory
stays near the size of the result plus two windows, and no page is touched twice. Where a read
fails (a damaged page, too little memory), it keeps nothing: each column is then read when it is
asked for, one at a time, as the reader always did, so a bad file fails at the same column with
the same sentence.

A column read later, one at a time, becomes NumPy through ``arrow.as_numpy``: no copy for one chunk
without nulls, one copy otherwise, the null slots written with a filler and their mask returned
(no Arrow ``fill_null``, which makes a second copy and imports pandas where it is installed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.trace import arrow
from tracekit.trace.schema import op_codes

__all__ = ["Columns", "Window", "is_text", "text_column", "window_op_codes"]


def is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t))


def _decodes_per_row(t: pa.DataType) -> bool:
    """Strings or bytes stored plain: read as a dictionary instead (``text_column``)."""
    return is_text(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def column(pf: pq.ParquetFile, name: str) -> pa.ChunkedArray:
    return pf.read(columns=[name]).column(0)


def text_column(p: Path, pf: pq.ParquetFile, name: str) -> pa.ChunkedArray:
    """Column ``name``, a string column read as a dictionary: a file whose schema says plain strings
    would otherwise decode a value repeated on every row once per row (one 10 kB call-site on
    a million rows: 10 GB from a few kB of file)."""
    if not _decodes_per_row(pf.schema_arrow.field(name).type):
        return column(pf, name)
    with open(p, "rb") as f:  # the same file, opened again with the dictionary request
        again = pq.ParquetFile(f, metadata=pf.metadata, read_dictionary=[name])
        return again.read(columns=[name]).column(0)


# Rows read together: each read is multi-threaded across columns and row groups, and its Arrow
# memory (reused by Arrow's pool from one window to the next) stays near WINDOW_ROWS rows of every
# column. 2^20 (the writer's row group): Arrow's peak 110 MB, not 170 MB with 2^21, and the process
# 100 MB smaller after a 10M-event read, as fast or faster (4 fresh reads each, 2-core machine:
# 0.85-1.07 s against 0.83-1.59 s); every MB a process touches first costs about 2 ms there.
WINDOW_ROWS = 1 << 20


@dataclass(frozen=True, eq=False)
class Window:
    """One window of rows as ``Columns`` has just read it, for a reader's ``on_window``: rows
    ``at`` to ``at + rows`` of ``total``. ``table``: the window's Arrow table (text columns as
    dictionaries); ``ints``: the integer columns' whole-file NumPy arrays (of the file's types),
    filled up to ``at + rows``, a null's slot holding a filler (0). Nothing is checked yet: the
    reader checks the whole file after."""

    table: pa.Table
    at: int
    rows: int
    total: int
    ints: Mapping[str, np.ndarray]


class Columns:
    """The columns ``names`` of an open trace, read at once where the file allows (see the module).

    The plain integer columns among ``ints`` are handed over as NumPy (``ints``), each copied once
    from the window it was read in into its whole-file array; the rest (text as dictionaries, the
    extras) are kept as Arrow chunks (``take``, ``get``).
    """

    def __init__(self, p: Path, pf: pq.ParquetFile, names: list[str], ints: list[str],
                 on_window: Callable[[Window], None] | None = None) -> None:
        self.path, self.pf = p, pf
        self._on_window = on_window
        self._held: dict[str, pa.ChunkedArray] = {}
        self._ints: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        schema = pf.schema_arrow
        numeric = [n for n in ints if n in names and pa.types.is_integer(schema.field(n).type)]
        try:
            self._read_all(names, numeric)
        except (pa.ArrowException, OSError, MemoryError):
            self._held, self._ints = {}, {}  # one column at a time from here: each fails where it always did

    def _read_all(self, names: list[str], numeric: list[str]) -> None:
        md, schema = self.pf.metadata, self.pf.schema_arrow
        n = md.num_rows
        out = {name: np.empty(n, arrow.numpy_dtype(schema.field(name).type)) for name in numeric}
        null: dict[str, np.ndarray] = {}
        kept: dict[str, list[pa.Array]] = {name: [] for name in names if name not in out}
        types: dict[str, pa.DataType] = {}
        text = [name for name in names if _decodes_per_row(schema.field(name).type)]

        def read(groups: list[int]) -> pa.Table:
            return again.read_row_groups(groups, columns=names, use_threads=True) if groups else \
                again.read(columns=names, use_threads=True)

        windows = _windows(md)
        copiers = _copiers(len(out))
        with open(self.path, "rb") as f, \
                ThreadPoolExecutor(1 + copiers, thread_name_prefix="tracekit-read") as ahead:
            again = pq.ParquetFile(f, metadata=md, read_dictionary=text)  # with the dictionary request
            at = 0
            coming = ahead.submit(read, windows[0])
            for k in range(len(windows)):
                table = coming.result()
                if k + 1 < len(windows):  # the next window decoded while this one is copied
                    coming = ahead.submit(read, windows[k + 1])
                m = table.num_rows
                copies = []
                for name, values in out.items():
                    col = table.column(name)
                    if col.null_count and name not in null:
                        null[name] = np.zeros(n, np.bool_)
                    nulls = null[name][at:at + m] if name in null else None
                    copies.append((col, values[at:at + m], nulls))
                if copiers:
                    for done in [ahead.submit(arrow.copy_into, *c, 0) for c in copies]:
                        done.result()
                else:
                    for c in copies:
                        arrow.copy_into(*c, 0)
                for name, chunks in kept.items():
                    col = table.column(name)
                    types[name] = col.type
                    chunks.extend(col.chunks)
                if self._on_window is not None:
                    self._on_window(Window(table, at, m, n, out))
                at += m
                del table
        self._ints = {name: (values, null.get(name)) for name, values in out.items()}
        self._held = {name: pa.chunked_array(chunks, type=types[name]) for name, chunks in kept.items()
                      if name in types}

    def ints(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Integer column ``name`` as ``arrow.as_numpy`` gives it (nulls as 0), no longer held here."""
        held = self._ints.pop(name, None)
        return held if held is not None else arrow.as_numpy(text_column(self.path, self.pf, name), 0)

    def take(self, name: str) -> pa.ChunkedArray:
        """Column ``name``, no longer held here (read now where it was not read at once)."""
        held = self._held.pop(name, None)
        return held if held is not None else text_column(self.path, self.pf, name)

    def get(self, name: str) -> pa.ChunkedArray:
        """Column ``name``, still held for a later ``take`` or ``get``."""
        held = self._held.get(name)
        return held if held is not None else text_column(self.path, self.pf, name)


def _copiers(columns: int) -> int:
    """Threads for the copies of a window's ``columns`` integer columns: one a column, at most one a
    core the process may use; 0 (the reading thread copies) on one core. NumPy's copies let go of
    the GIL, so the columns' copies, and their first touch of fresh pages, run in parallel beside the
    next window's decode (2-core machine, 10M events, 5 interleaved first reads: 0.85-0.95 s against
    0.87-0.98 s copied on the reading thread)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(columns, cores) if cores > 1 else 0


def _windows(md: pq.FileMetaData) -> list[list[int]]:
    """The row groups in reads of about ``WINDOW_ROWS`` rows (one empty read for a file of none)."""
    out: list[list[int]] = [[]]
    rows = 0
    for g in range(md.num_row_groups):
        if out[-1] and rows + md.row_group(g).num_rows > WINDOW_ROWS:
            out.append([])
            rows = 0
        out[-1].append(g)
        rows += md.row_group(g).num_rows
    return out


def window_op_codes(window: Window, out: np.ndarray) -> bool:
    """The window's ops as ``Op`` codes into ``out`` (the whole file's int8 array, at the window's
    rows), -1 for a name the format does not have; False where the column has nulls or is not the
    dictionary-encoded text ``Columns`` reads (the reader then refuses or reads it its own way)."""
    col = window.table.column("op") if "op" in window.table.column_names else None
    if col is None or col.null_count:
        return False
    at = window.at
    for chunk in col.chunks:
        if not (pa.types.is_dictionary(chunk.type) and is_text(chunk.type.value_type)):
            return False
        m = len(chunk)
        out[at:at + m] = op_codes(chunk.dictionary.to_pylist())[arrow.filled(chunk.indices)]
        at += m
    return at == window.at + window.rows
