"""Writing traces (format v3): in row groups, LZ4-compressed (``parquet_options``), atomically.

``TraceWriter`` streams batches of ``Events`` into a temporary file beside the
target and renames it into place only when closed cleanly (``tracekit.outputs``,
the one writer of every output), so an interrupted write never leaves a half
file under the user's name and never clobbers an existing file with garbage.
The caller checks the path first (``outputs.check_output``: inputs, --force).
``write_trace`` is the one-shot form. Each batch's stack ids are remapped into one table for the
whole file (batches of one trace share their ``StackTable`` object: no remapping), which is written
under the ``tracekit.stacks`` metadata key when the file is closed.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.inputs import utf8_name
from tracekit.outputs import Staged, cannot_write
from tracekit.trace.arrow import array_of, strings_of
from tracekit.trace.events import Events
from tracekit.trace.schema import OP_NAMES, STACK_FIELD, Op, TraceMeta, arrow_schema
from tracekit.trace.stacks import META_KEY as STACKS_KEY
from tracekit.trace.stacks import StackInterner, StackTable

ROW_GROUP = 1 << 20


def events_to_arrays(ev: Events) -> list[pa.Array]:
    """The nine v1 columns of ``ev`` as Arrow arrays, with nulls where the op says so (``stack``,
    whose ids depend on the file's whole table, is the writer's)."""
    op_dict = strings_of(OP_NAMES)
    no_rounded = (ev.op != Op.MALLOC) & (ev.op != Op.OOM)
    site_idx = array_of(ev.site, pa.int32(), mask=ev.site < 0)
    # A call-site from an untrusted file may hold lone surrogates, which UTF-8 cannot store.
    sites = [s if s.isascii() else s.encode("utf-8", "replace").decode("utf-8") for s in ev.sites]
    return [
        array_of(ev.seq, pa.uint64()),
        array_of(ev.t_ns, pa.int64()),
        pa.DictionaryArray.from_arrays(array_of(ev.op, pa.int8()), op_dict),
        array_of(ev.addr, pa.uint64(), mask=ev.op == Op.OOM),
        array_of(ev.size, pa.uint64()),
        array_of(ev.rounded, pa.uint64(), mask=no_rounded),
        array_of(ev.stream, pa.uint64()),
        array_of(ev.device, pa.int16()),
        pa.DictionaryArray.from_arrays(site_idx, strings_of(sites)),
    ]


# Columns whose values grow steadily (one per event, rarely repeated): their deltas, bit-packed,
# instead of a dictionary that would fill and be given up on every row group.
DELTA_COLUMNS = ("seq", "t_ns")


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """How a trace's columns are stored: LZ4 (the raw block format) instead of zstd, and ``seq`` and
    ``t_ns`` delta-encoded, every other column with a dictionary. Measured on a 10M-event ``random``
    trace (2-core machine): 105 MB against 110 MB, a whole read of every column in 0.38 s against
    0.48 s; a ``training`` trace is 38 % smaller.
    Any Parquet reader reads both (polars and pyarrow included); older traces read as before."""
    delta = [name for name in DELTA_COLUMNS if name in schema.names]
    return {"compression": "lz4", "use_dictionary": [n for n in schema.names if n not in delta],
            "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED")}


class TraceWriter:
    """Stream ``Events`` batches (plus optional extra columns) into a Parquet file of format v3."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        meta: TraceMeta,
        extra_fields: tuple[pa.Field, ...] = (),
        row_group_size: int = ROW_GROUP,
    ) -> None:
        self.path = Path(path)
        self.schema = arrow_schema(meta, extra_fields)
        self.row_group_size = row_group_size
        self.rows = 0
        self._stacks = _FileStacks() if STACK_FIELD.name not in extra_names(extra_fields) else None
        self._staged = Staged(self.path)
        name = utf8_name(self._staged.tmp)  # None: a name that is not UTF-8, written through Python's file
        try:
            self._file = None if name is not None else open(self._staged.tmp, "wb")  # noqa: SIM115
            self._pq = pq.ParquetWriter(name or self._file, self.schema, **parquet_options(self.schema))
        except OSError as e:
            self._staged.discard()
            raise cannot_write(self.path, e) from None

    def write(self, ev: Events, extras: dict[str, np.ndarray | pa.Array] | None = None) -> None:
        if len(ev) == 0:
            return
        arrays = events_to_arrays(ev)
        if self._stacks is not None:
            ids = self._stacks.ids(ev)
            arrays.append(array_of(ids, pa.int32(), mask=ids < 0))
        for f in list(self.schema)[len(arrays):]:
            col = (extras or {}).get(f.name)
            if col is None:
                arrays.append(pa.nulls(len(ev), type=f.type))
            else:
                arrays.append(array_of(col, f.type) if not isinstance(col, pa.Array) else col)
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        try:
            self._pq.write_table(table, row_group_size=self.row_group_size)
        except OSError as e:  # a full disk, a file size limit
            raise cannot_write(self.path, e) from None
        self.rows += len(ev)

    def close(self) -> Path:
        try:
            if self._stacks is not None:
                text = json.dumps(self._stacks.table().to_json(), separators=(",", ":"))
                self._pq.add_key_value_metadata({STACKS_KEY: text.encode()})
            self._pq.close()
            if self._file is not None:
                self._file.close()
            return self._staged.commit()
        except OSError as e:
            raise cannot_write(self.path, e) from None
        finally:
            self._staged.discard()

    def abort(self) -> None:
        try:
            with contextlib.suppress(OSError):  # the write already failed (a full disk): say that
                self._pq.close()
                if self._file is not None:
                    self._file.close()
        finally:
            self._staged.discard()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None:
            self.close()
        else:
            self.abort()


def extra_names(fields: tuple[pa.Field, ...]) -> set[str]:
    return {f.name for f in fields}


class _FileStacks:
    """The stack table of one file, merged from its batches' tables (``StackInterner``) only when
    a batch brings a table other than the first one's."""

    def __init__(self) -> None:
        self._first: StackTable | None = None
        self._interner: StackInterner | None = None
        self._last: StackTable | None = None
        self._lut: np.ndarray | None = None  # None: the first table's ids stand

    def ids(self, ev: Events) -> np.ndarray:
        """``ev.stack`` as ids of the file's table."""
        t = ev.stacks
        if t is not self._last:
            if self._first is None:
                self._first, self._lut = t, None
            else:
                if self._interner is None:
                    self._interner = StackInterner()
                    self._interner.add(self._first)  # the first table's ids stay what they were
                self._lut = self._interner.add(t)
            self._last = t
        return ev.stack if self._lut is None else self._lut[ev.stack]

    def table(self) -> StackTable:
        if self._interner is not None:
            return self._interner.table()
        return self._first if self._first is not None else StackTable.empty()


def write_trace(
    path: str | os.PathLike[str],
    meta: TraceMeta,
    ev: Events,
    extras: dict[str, np.ndarray | pa.Array] | None = None,
    extra_fields: tuple[pa.Field, ...] = (),
) -> Path:
    """Write a whole trace at once. ``extras`` must match ``extra_fields`` by name."""
    if extras and not extra_fields:
        extra_fields = tuple(
            pa.field(k, v.type if isinstance(v, pa.Array) else pa.from_numpy_dtype(v.dtype))
            for k, v in extras.items()
        )
    with TraceWriter(path, meta, extra_fields) as w:
        for start in range(0, max(len(ev), 1), ROW_GROUP):
            sl = slice(start, start + ROW_GROUP)
            w.write(
                ev.take(sl),
                {k: v[sl] for k, v in (extras or {}).items()},
            )
    return Path(path)
