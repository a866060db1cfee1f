"""Peak memory is bounded by the input: at most 512 MiB plus 64 bytes per byte of the input file.

Each verb runs in a child of a small wrapper process, which reports the
child's peak resident set (``getrusage(RUSAGE_CHILDREN).ru_maxrss``: the
largest of the verb and any process it waited for, a report's drawing
child). Inputs, generated here with Arrow buffers (no
Python string per value, so the test itself stays small):

- one call-site of 256 MiB in an 11 kB file (was 2.3 GB to analyze);
- 100,000 distinct call-sites of 10 kB, 1 GB of text in a 2 MB file
  (was 5.9 GB to advise, 7.8 GB to report);
- a file whose schema says plain strings while its pages are
  dictionary-encoded: one 10 kB value on 200,000 rows, in the call-sites and
  in an extra column (2 GB each once decoded row by row);
- call-sites just under the bound (8,000,000 bytes in all), which are read.

The first two are refused in one sentence, the others analyzed, advised and
reported; every run stays within ``tracekit.workers.peak_bytes(input)``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit.trace.reader import MAX_SITE_BYTES, MAX_SITES_BYTES
from tracekit.trace.schema import OP_NAMES, Op, Source, TraceMeta, arrow_schema
from tracekit.workers import peak_bytes

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _strings(count: int, length: int, first: int = 0) -> pa.Array:
    """``count`` distinct strings of ``length`` bytes, ``%08d`` of their number then ``y``s, built in one
    buffer."""
    data = np.full((count, length), ord("y"), np.uint8)
    digits = np.char.zfill(np.arange(first, first + count).astype(str), 8).astype("S8")
    data[:, :8] = np.frombuffer(digits.tobytes(), np.uint8).reshape(count, 8)
    offsets = np.arange(count + 1, dtype=np.int64) * length
    values = pa.LargeStringArray.from_buffers(count, pa.py_buffer(offsets), pa.py_buffer(data))
    return values.cast(pa.string())


def _columns(n: int, first_seq: int, site: pa.Array) -> list[pa.Array]:
    """n/2 mallocs of 1 KiB, each freed at once, at addresses 0, 4 KiB, ...; call-sites ``site``."""
    half = n // 2
    op = np.tile(np.array([Op.MALLOC, Op.FREE], np.int8), half)
    addr = np.repeat(np.arange(half, dtype=np.uint64) * 4096, 2)
    seq = np.arange(first_seq, first_seq + n, dtype=np.uint64)
    return [pa.array(seq), pa.array(seq.astype(np.int64)),
            pa.DictionaryArray.from_arrays(pa.array(op), pa.array(OP_NAMES)), pa.array(addr),
            pa.array(np.full(n, 1024, np.uint64)),
            pa.array(np.full(n, 1024, np.uint64), mask=op != Op.MALLOC),
            pa.array(np.zeros(n, np.uint64)), pa.array(np.zeros(n, np.int16)), site,
            pa.nulls(n, pa.int32())]  # format 3's stack column: no stacks


def _write(path: Path, batches: list[tuple[int, pa.Array]], meta: TraceMeta) -> Path:
    """A trace of one row group per (distinct call-sites, their count) batch; each site used twice."""
    schema = arrow_schema(meta)
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        seq = 0
        for count, sites in batches:
            idx = pa.array(np.repeat(np.arange(count, dtype=np.int32), 2))
            cols = _columns(2 * count, seq, pa.DictionaryArray.from_arrays(idx, sites))
            w.write_table(pa.Table.from_arrays(cols, schema=schema))
            seq += 2 * count
    return path


LIMITED = TraceMeta.new(Source.SYNTHETIC, pool_limit_bytes=1 << 30)  # advise needs a limit


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bound")
    files = {
        "one-site": _write(d / "one-site.parquet", [(1, _strings(1, 256 << 20))], LIMITED),
        "many-sites": _write(d / "many-sites.parquet",
                             [(10_000, _strings(10_000, 10_000, k * 10_000)) for k in range(10)], LIMITED),
        "near": _write(d / "near.parquet", [(800, _strings(800, 10_000))], LIMITED),
        "plain": _plain_schema(d / "plain.parquet", 200_000, 10_000),
    }
    return files


def _plain_schema(path: Path, n: int, length: int) -> Path:
    """One ``length``-byte value on all ``n`` rows of 'site' and of an extra 'note' column, stored
    dictionary-encoded under a schema that says plain strings (no Arrow schema in the file)."""
    one = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), _strings(1, length))
    cols = _columns(n, 0, one)
    fields = list(arrow_schema(LIMITED))
    table = pa.Table.from_arrays([*cols, one], schema=pa.schema([*fields, pa.field("note", one.type)]))
    with pq.ParquetWriter(path, table.schema, compression="zstd", store_schema=False) as w:
        w.write_table(table)
        w.add_key_value_metadata({"tracekit": LIMITED.to_json()})
    return path


_WRAPPER = ("import resource, subprocess, sys; "
            "r = subprocess.run(sys.argv[1:], capture_output=True, text=True); sys.stderr.write(r.stderr); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def _peak(*args: str) -> tuple[int, int, str]:
    """(exit code, peak RSS in bytes, stderr) of ``tracekit ARGS`` in a child of a fresh wrapper."""
    res = subprocess.run([sys.executable, "-c", _WRAPPER, sys.executable, "-m", "tracekit", *args],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    rc, kib = res.stdout.split()
    return int(rc), int(kib) * 1024, res.stderr


def _verb(verb: str, path: Path, tmp: Path) -> list[str]:
    if verb == "report":
        return ["report", str(path), "-o", str(tmp / f"{path.stem}.html"), "--force"]
    return [verb, str(path)]


@pytest.mark.parametrize("verb", ["analyze", "advise", "report"])
@pytest.mark.parametrize(("name", "says"), [
    ("one-site", "bytes of text once decompressed"),
    ("many-sites", "bytes of text once decompressed"),
])
def test_a_small_file_asking_for_huge_memory_is_refused_within_the_bound(
        inputs: dict[str, Path], tmp_path: Path, verb: str, name: str, says: str) -> None:
    path = inputs[name]
    rc, peak, err = _peak(*_verb(verb, path, tmp_path))
    assert rc == 1 and says in err and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1
    assert peak <= peak_bytes(path.stat().st_size), f"{verb} {name}: {peak / 2**20:.0f} MiB"


@pytest.mark.parametrize("verb", ["analyze", "advise", "report"])
@pytest.mark.parametrize("name", ["near", "plain"])
def test_text_within_the_bound_is_read_within_the_bound(
        inputs: dict[str, Path], tmp_path: Path, verb: str, name: str) -> None:
    path = inputs[name]
    rc, peak, err = _peak(*_verb(verb, path, tmp_path))
    assert rc == 0 and "Traceback" not in err, err
    assert peak <= peak_bytes(path.stat().st_size), f"{verb} {name}: {peak / 2**20:.0f} MiB"


def test_the_file_sizes_are_what_makes_them_hostile(inputs: dict[str, Path]) -> None:
    # what the bound is measured against: small files (and the near one holds 8,000,000 bytes of sites)
    sizes = {k: p.stat().st_size for k, p in inputs.items()}
    assert sizes["one-site"] < 64 << 10 and sizes["many-sites"] < 4 << 20 and sizes["plain"] < 2 << 20
    assert MAX_SITES_BYTES >= 800 * 10_000 and MAX_SITE_BYTES >= 10_000


def test_a_site_beyond_the_bound_in_a_file_large_enough_to_declare_it(tmp_path: Path) -> None:
    """Past the declared-size check (a file big enough for its text), the decoded call-sites are
    still held to MAX_SITE_BYTES each and MAX_SITES_BYTES in all."""
    from tracekit.errors import TraceFormatError
    from tracekit.trace.reader import read_trace

    long_one = _write(tmp_path / "long.parquet", [(1, _strings(1, MAX_SITE_BYTES + 1))], LIMITED)
    with pytest.raises(TraceFormatError, match=f"a call-site of {MAX_SITE_BYTES + 1:,} bytes"):
        read_trace(long_one)
    count = MAX_SITES_BYTES // 8000 + 1
    many = _write(tmp_path / "many.parquet", [(count, _strings(count, 8000))], LIMITED)
    with pytest.raises(TraceFormatError, match=f"{count:,} distinct call-sites of {count * 8000:,} bytes"):
        read_trace(many)
    ok = read_trace(_write(tmp_path / "ok.parquet", [(count - 2, _strings(count - 2, 8000))], LIMITED))
    assert len(ok.events.sites) == count - 2 and ok.events.sites[1] == "00000001" + "y" * 7992


def test_plain_schema_text_is_read_as_one_value(inputs: dict[str, Path]) -> None:
    from tracekit.trace.reader import read_trace

    trace = read_trace(inputs["plain"])
    assert trace.events.sites == ("00000000" + "y" * 9992,)
    note = trace.extras.column("note") if trace.extras is not None else None
    assert note is not None and pa.types.is_dictionary(note.type) and len(note) == 200_000
    assert json.loads(json.dumps(trace.meta.to_dict()))["pool_limit_bytes"] == 1 << 30


def test_an_extra_text_column_is_held_to_the_same_bound(tmp_path: Path) -> None:
    """Not only call-sites: a 64 MiB value in an extra column is refused when the file is opened."""
    from tracekit.errors import InputError
    from tracekit.trace.reader import TEXT_FREE_BYTES, read_meta

    note = pa.DictionaryArray.from_arrays(pa.array(np.zeros(2, np.int32)), _strings(1, 64 << 20))
    site = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["a.py:1:f"]))
    cols = _columns(2, 0, site)
    base = arrow_schema(LIMITED)
    schema = pa.schema([*base, pa.field("note", note.type)], metadata=base.metadata)
    path = tmp_path / "note.parquet"
    with pq.ParquetWriter(path, schema, compression="zstd") as w:
        w.write_table(pa.Table.from_arrays([*cols, note], schema=schema))
    size = path.stat().st_size
    assert TEXT_FREE_BYTES + 64 * size < 64 << 20  # what makes it hostile: the file is small
    with pytest.raises(InputError, match=r"column 'note' holds 67,10\d,\d\d\d bytes of text once decomp"):
        read_meta(path)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _understate(src: Path, dst: Path, column: int, claim: int) -> Path:
    """``src`` with column ``column``'s ``total_uncompressed_size`` in the footer rewritten to ``claim``
    (a Thrift zigzag varint, padded to the same length so the footer keeps its layout)."""
    data = bytearray(src.read_bytes())
    true = pq.ParquetFile(src).metadata.row_group(0).column(column).total_uncompressed_size
    old, new = _varint(true << 1), bytearray(_varint(claim << 1))
    while len(new) < len(old):  # a varint may carry empty continuation bytes
        new[-1] |= 0x80
        new.append(0)
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    at = data.index(old, footer)
    data[at:at + len(old)] = new
    dst.write_bytes(bytes(data))
    assert pq.ParquetFile(dst).metadata.row_group(0).column(column).total_uncompressed_size == claim
    return dst


def test_a_footer_that_understates_its_text_is_caught_by_the_page_headers(
        inputs: dict[str, Path], tmp_path: Path) -> None:
    """The 256 MiB call-site, its footer claiming 1,000 bytes: the pages' own headers say 256 MiB."""
    liar = _understate(inputs["one-site"], tmp_path / "liar.parquet", 8, 1000)
    rc, peak, err = _peak("analyze", str(liar))
    assert rc == 1 and "column 'site' holds 268,435,4" in err and "Traceback" not in err, err
    assert peak <= peak_bytes(liar.stat().st_size), f"{peak / 2**20:.0f} MiB"
