"""Give committed PyTorch traces the whole stacks their snapshots hold (trace format 3).

``python scripts/add_stacks_to_fixtures.py traces/torch-oom.parquet ...`` imports each trace's
snapshot (``TRACE.pickle.gz`` beside it) with today's importer, checks that every column the
committed trace has equals the fresh import's (call-sites compared after
the rule below for frame paths, which ``record --torch`` applied to them), and then rewrites
the committed trace with the fresh ``stack`` column and ``tracekit.stacks`` table added,
``schema_version`` 3, and everything else kept: its columns, its metadata (a recording's
``exit``, ``launch`` and limits stay) and its row groups. Frame paths are made relative the way
the recorder makes call-sites relative: the checkout or pytest folder it was recorded from
(``relativize_sites.RULES``), then any installed package's folder (``.../site-packages/``), then
the standard library's (``.../lib/python3.N/``), so no folder of the recording machine remains.
A trace whose columns differ from its fresh import is left alone and named.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tracekit.importers.torch_snapshot import import_snapshot
from tracekit.outputs import Staged
from tracekit.record.torch_trace import launcher_frames
from tracekit.trace.stacks import META_KEY as STACKS_KEY
from tracekit.trace.stacks import from_json, trim_outer

HERE = Path(__file__).resolve().parent
LIBRARY = (re.compile(r"^.*/(?:site|dist)-packages/"), re.compile(r"^/usr/(?:local/)?lib/python3\.\d+/"))


def _relative_sites():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("relativize_sites", HERE / "relativize_sites.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def relative_file(path: str, rules: tuple[re.Pattern[str], ...]) -> str:
    for rule in (*rules, *LIBRARY):
        new = rule.sub("", path)
        if new != path:
            return new
    return path


def add_stacks(trace: Path) -> str:
    snap = trace.with_name(trace.name.removesuffix(".parquet") + ".pickle.gz")
    if not snap.exists():
        return f"{trace}: no snapshot beside it"
    rs = _relative_sites()
    with tempfile.TemporaryDirectory() as tmp:
        fresh_path = import_snapshot(snap, Path(tmp) / "f.parquet").path
        fresh = pq.read_table(fresh_path)
        fresh_meta = pq.ParquetFile(fresh_path).metadata.metadata or {}  # written at close, beside the schema
    pf = pq.ParquetFile(trace)
    old = pf.read()
    sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    for name in old.column_names:
        if name == "stack":
            continue
        x, y = old.column(name), fresh.column(name) if name in fresh.column_names else None
        if y is None:  # a column the recorder added (a recording's pool ids): kept as it is
            continue
        same = (x.to_pylist() == [s and relative_file(s, rs.RULES) for s in y.to_pylist()] if name == "site"
                else x.to_pylist() == y.to_pylist() if pa.types.is_dictionary(x.type) else x.equals(y))
        if not same:
            return f"{trace}: column {name} differs from a fresh import; left alone"
    table = from_json(json.loads(fresh_meta[STACKS_KEY]))
    table = dataclasses.replace(table, file=tuple(relative_file(f, rs.RULES) for f in table.file))
    ids = fresh.column("stack").fill_null(-1).to_numpy().astype(np.int64)
    info = json.loads((old.schema.metadata or {})[b"tracekit"])
    if "launch" in info:  # recorded by record --torch: its launcher's frames go, as the recorder does now
        table, lut = trim_outer(table, launcher_frames(table))
        ids = lut[ids].astype(np.int64)
    stack_col = pa.array(ids.astype(np.int32), pa.int32(), mask=ids < 0)
    stacks = table.to_json()
    meta = dict(old.schema.metadata or {})
    info["schema_version"] = 3
    meta[b"tracekit"] = json.dumps(info).encode()
    cols, fields = [], []
    names = fresh.column_names + [n for n in old.column_names if n not in fresh.column_names]
    for name in names:  # the fresh import's order, as a reader compares them; the recorder's own last
        src = fresh if name == "stack" or name not in old.column_names else old
        cols.append(stack_col if name == "stack" else src.column(name))
        fields.append(src.schema.field(name))
    table = pa.Table.from_arrays(cols, schema=pa.schema(fields, metadata=meta))
    with Staged(trace) as staged, pq.ParquetWriter(staged.tmp, table.schema, compression="zstd") as w:
        at = 0
        for n in sizes:
            w.write_table(table.slice(at, n))
            at += n
        w.add_key_value_metadata({STACKS_KEY: json.dumps(stacks).encode()})
    return f"{trace}: {len(stacks['stacks']['frame'])} stacks of {len(stacks['frames']['file'])} frames added"


def main() -> int:
    for arg in sys.argv[1:]:
        print(add_stacks(Path(arg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
