"""Writing v1 traces: in row groups, zstd-compressed, atomically.

``TraceWriter`` streams batches of ``Events`` into a temporary file beside the
target and renames it into place only when closed cleanly (``tracekit.outputs``,
the one writer of every output), so an interrupted write never leaves a half
file under the user's name and never clobbers an existing file with garbage.
The caller checks the path first (``outputs.check_output``: inputs, --force).
``write_trace`` is the one-shot form.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.inputs import utf8_name
from tracekit.outputs import Staged, cannot_write
from tracekit.trace.events import Events
from tracekit.trace.schema import OP_NAMES, Op, TraceMeta, arrow_schema

ROW_GROUP = 1 << 20


def events_to_arrays(ev: Events) -> list[pa.Array]:
    """The nine v1 columns of ``ev`` as Arrow arrays, with nulls where the op says so."""
    op_dict = pa.array(OP_NAMES, type=pa.string())
    no_rounded = (ev.op != Op.MALLOC) & (ev.op != Op.OOM)
    site_idx = pa.array(ev.site, type=pa.int32(), mask=ev.site < 0)
    # A call-site from an untrusted file may hold lone surrogates, which UTF-8 cannot store.
    sites = [s if s.isascii() else s.encode("utf-8", "replace").decode("utf-8") for s in ev.sites]
    return [
        pa.array(ev.seq, type=pa.uint64()),
        pa.array(ev.t_ns, type=pa.int64()),
        pa.DictionaryArray.from_arrays(pa.array(ev.op, type=pa.int8()), op_dict),
        pa.array(ev.addr, type=pa.uint64(), mask=ev.op == Op.OOM),
        pa.array(ev.size, type=pa.uint64()),
        pa.array(ev.rounded, type=pa.uint64(), mask=no_rounded),
        pa.array(ev.stream, type=pa.uint64()),
        pa.array(ev.device, type=pa.int16()),
        pa.DictionaryArray.from_arrays(site_idx, pa.array(sites, type=pa.string())),
    ]


class TraceWriter:
    """Stream ``Events`` batches (plus optional extra columns) into a v1 Parquet file."""

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
        self._staged = Staged(self.path)
        name = utf8_name(self._staged.tmp)  # None: a name that is not UTF-8, written through Python's file
        try:
            self._file = None if name is not None else open(self._staged.tmp, "wb")  # noqa: SIM115
            self._pq = pq.ParquetWriter(name or self._file, self.schema, compression="zstd")
        except OSError as e:
            self._staged.discard()
            raise cannot_write(self.path, e) from None

    def write(self, ev: Events, extras: dict[str, np.ndarray | pa.Array] | None = None) -> None:
        if len(ev) == 0:
            return
        arrays = events_to_arrays(ev)
        for f in list(self.schema)[len(arrays):]:
            col = (extras or {}).get(f.name)
            if col is None:
                arrays.append(pa.nulls(len(ev), type=f.type))
            else:
                arrays.append(pa.array(col, type=f.type) if not isinstance(col, pa.Array) else col)
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        try:
            self._pq.write_table(table, row_group_size=self.row_group_size)
        except OSError as e:  # a full disk, a file size limit
            raise cannot_write(self.path, e) from None
        self.rows += len(ev)

    def close(self) -> Path:
        try:
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
