"""Rewrite the call-site names of committed traces so no path of the machine that recorded them remains.

``python scripts/relativize_sites.py TRACE.parquet...`` replaces, in the
``site`` column's dictionary only, a call-site path under the checkout it was
recorded from (``/work/main/`` or one of its ``out/NAME/`` copies) with the
path relative to the repository (``scripts/x.py:63:main``), and one under a
pytest temporary folder with the file's name (the program's folder is where
the recorder makes sites relative to). Indices, every other column, the
schema, its metadata and the row groups' sizes are kept; the file is
replaced atomically and checked to read back equal apart from those names.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tracekit.outputs import Staged

RULES = (re.compile(r"^/work/main/(?:out/[^/]+/)?"), re.compile(r"^/tmp/pytest-of-[^/]+/pytest-\d+/[^/]+/"))


def relative(site: str | None) -> str | None:
    """``site`` with the recording machine's folder taken off (unchanged if it has none)."""
    if site is None:
        return None
    for rule in RULES:
        site = rule.sub("", site)
    return site


def _column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    chunks = []
    for ch in col.chunks:
        names = pa.array([relative(s) for s in ch.dictionary.to_pylist()], pa.string())
        chunks.append(pa.DictionaryArray.from_arrays(ch.indices, names))
    return pa.chunked_array(chunks, col.type)


def rewrite(path: Path) -> int:
    """Rewrite ``path`` in place; returns how many call-site names changed."""
    pf = pq.ParquetFile(path)
    sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
    table = pf.read()
    i = table.schema.get_field_index("site")
    new = table.set_column(i, table.schema.field(i), _column(table.column(i)))
    changed = sum(a != b for a, b in zip(table.column(i).chunk(0).dictionary.to_pylist(),
                                          new.column(i).chunk(0).dictionary.to_pylist(), strict=True)) \
        if table.column(i).num_chunks else 0
    if not changed:
        return 0
    with Staged(path) as staged, pq.ParquetWriter(staged.tmp, new.schema, compression="zstd") as w:
        start = 0
        for n in sizes:  # the same row groups as before
            w.write_table(new.slice(start, n), row_group_size=max(n, 1))
            start += n
    back = pq.read_table(path)
    assert back.schema.equals(table.schema, check_metadata=True)
    assert back.drop_columns(["site"]).equals(table.drop_columns(["site"]))
    want = pc.cast(table.column("site"), pa.string()).to_pylist()
    assert pc.cast(back.column("site"), pa.string()).to_pylist() == [relative(s) for s in want]
    assert [pq.ParquetFile(path).metadata.row_group(k).num_rows for k in range(len(sizes))] == sizes
    return int(changed)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(f"{arg}: {rewrite(Path(arg))} call-site names made relative")
