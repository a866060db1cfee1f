"""Trace format v1: round trips, and the exact sentence for every invalid input."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import InputError, OutputError, TraceFormatError
from tracekit.trace import Events, Op, Source, TraceMeta, read_meta, read_trace, write_trace
from tracekit.trace.schema import DeviceInfo
from tracekit.trace.writer import TraceWriter

DATA = Path(__file__).resolve().parents[1] / "data"

BAD = {
    "missing_column.parquet": "missing required column 'size'",
    "wrong_type.parquet": "column 'size' has type string, expected an integer type",
    "seq_not_increasing.parquet": "seq is not strictly increasing at seq 2 (after 2)",
    "t_ns_decreasing.parquet": "t_ns decreases at seq 2",
    "unknown_op.parquet": "unknown op 'calloc' at seq 1",
    "missing_size.parquet": "missing size at seq 1 (malloc row)",
    "missing_addr.parquet": "missing addr at seq 1 (malloc row)",
    "bad_source.parquet": "unknown source 'tensorflow' in metadata",
    "no_metadata.parquet": "no 'tracekit' metadata; this is not a tracekit trace",
    "empty.parquet": "the file is empty",
    "not_parquet.parquet": "not a readable Parquet file, or it is truncated",
    "truncated.parquet": "not a readable Parquet file, or it is truncated",
    "huge_size.parquet": "column 'size' holds 9223372036854775813 bytes, beyond any device",
    "device_out_of_range.parquet": "column 'device' holds 70000, outside the int16 range",
    "bad_meta_value.parquet": "malformed value (pool_limit_bytes must be an integer, got '4GiB')",
    "bad_meta_versions.parquet": "malformed value (versions must be an object, got list)",
}


def small_events() -> Events:
    # malloc A, malloc B, free A, oom, free B
    return Events.build(
        op=np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM, Op.FREE], np.int8),
        size=np.array([100, 3000, 512, 1 << 30, 3072], np.uint64),
        addr=np.array([0x1000, 0x2000, 0x1000, 0, 0x2000], np.uint64),
        rounded=np.array([512, 3072, 0, 1 << 30, 0], np.uint64),
        stream=np.array([0, 7, 0, 0, 7], np.uint64),
        site=np.array([0, 1, -1, 1, -1], np.int32),
        sites=("app.py:3:f", "app.py:9:g"),
    )


def test_round_trip_keeps_every_column_and_metadata(tmp_path: Path) -> None:
    meta = TraceMeta.new(
        Source.CUPY, device=DeviceInfo("NVIDIA H200", 150_109_880_320, 149_557_477_376),
        pool_limit_bytes=1 << 30, command="python app.py",
    ).with_extra(budget={"context_bytes": 552_402_944})
    ev = small_events()
    write_trace(tmp_path / "t.parquet", meta, ev, extras={"latency_ns": np.arange(5, dtype=np.int64)})
    t = read_trace(tmp_path / "t.parquet")
    for name in ("seq", "t_ns", "op", "addr", "size", "rounded", "stream", "device", "site"):
        np.testing.assert_array_equal(getattr(t.events, name), getattr(ev, name), err_msg=name)
    assert t.events.sites == ev.sites
    assert t.meta == meta
    assert t.meta.extra["budget"]["context_bytes"] == 552_402_944
    assert t.extras is not None and t.extras.column("latency_ns").to_pylist() == [0, 1, 2, 3, 4]
    # free of A (index 2) pairs with malloc A (index 0); the oom row pairs with nothing.
    assert t.mate.tolist() == [2, 4, 0, -1, 1]
    assert t.issues == () and t.dropped == 0


def test_site_dictionary_grows_across_row_groups(tmp_path: Path) -> None:
    meta = TraceMeta.new(Source.SYNTHETIC)
    with TraceWriter(tmp_path / "t.parquet", meta) as w:
        for k in range(3):
            w.write(Events.build(op=np.array([Op.MALLOC], np.int8), size=np.array([512], np.uint64),
                                 addr=np.array([k * 512], np.uint64), seq=np.array([k], np.uint64),
                                 t_ns=np.array([k], np.int64), site=np.array([0], np.int32),
                                 sites=(f"s{k}.py:1:f",)))
    t = read_trace(tmp_path / "t.parquet")
    assert [t.events.site_name(i) for i in range(3)] == ["s0.py:1:f", "s1.py:1:f", "s2.py:1:f"]


def test_null_rounded_falls_back_to_size(tmp_path: Path) -> None:
    t = read_trace(DATA / "valid_small.parquet")
    assert t.events.rounded.tolist() == [512, 1024, 0]


@pytest.mark.parametrize("name,message", sorted(BAD.items()))
def test_each_invalid_file_gets_one_clear_sentence(name: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        read_trace(DATA / name)
    text = str(err.value)
    assert text.startswith(str(DATA / name) + ": ")
    assert message in text
    assert "\n" not in text


def test_a_version_beyond_3_is_refused(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    write_trace(tmp_path / "t.parquet", TraceMeta.new(Source.SYNTHETIC), small_events())
    table = pq.read_table(tmp_path / "t.parquet")
    meta = dict(table.schema.metadata)
    meta[b"tracekit"] = meta[b"tracekit"].replace(b'"schema_version": 3', b'"schema_version": 4')
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "v4.parquet")
    with pytest.raises(TraceFormatError, match=r"unsupported schema_version 4 \(this tracekit reads "
                                               r"versions 1, 2 and 3\)$"):
        read_trace(tmp_path / "v4.parquet")


def test_structural_faults_are_format_errors() -> None:
    with pytest.raises(TraceFormatError):
        read_trace(DATA / "unknown_op.parquet")
    with pytest.raises(InputError, match="no such file"):
        read_meta(DATA / "does_not_exist.parquet")


def test_inconsistent_events_are_skipped_with_counts_and_first_seq() -> None:
    # malloc@4096, free@4096, free@4096 (double), free@9999 (never live),
    # malloc@8192, malloc@8192 (already live)
    t = read_trace(DATA / "inconsistent.parquet")
    found = {i.kind.name: (i.count, i.first_seq) for i in t.issues}
    assert found == {"FREE_NOT_LIVE": (1, 3), "DOUBLE_FREE": (1, 2), "MALLOC_LIVE": (1, 5)}
    assert t.dropped == 3
    assert t.events.seq.tolist() == [0, 1, 4]
    assert t.mate.tolist() == [1, 0, -1]


def test_strict_turns_inconsistencies_into_errors() -> None:
    with pytest.raises(TraceFormatError, match="inconsistent events"):
        read_trace(DATA / "inconsistent.parquet", strict=True)


def test_writer_refuses_missing_folder_and_leaves_no_partial_file(tmp_path: Path) -> None:
    with pytest.raises(OutputError, match="does not exist"):
        write_trace(tmp_path / "nope" / "t.parquet", TraceMeta.new(Source.SYNTHETIC), small_events())
    target = tmp_path / "keep.parquet"
    target.write_bytes(b"user data")
    with pytest.raises(RuntimeError), TraceWriter(target, TraceMeta.new(Source.SYNTHETIC)) as w:
        w.write(small_events())
        raise RuntimeError("interrupted")
    assert target.read_bytes() == b"user data"
    assert list(tmp_path.iterdir()) == [target]


runner = CliRunner()


def test_info_cli_text_and_json(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.parquet", TraceMeta.new(Source.CUPY), small_events())
    res = runner.invoke(app, ["info", str(tmp_path / "t.parquet")])
    assert res.exit_code == 0, res.output
    assert "malloc" in res.output and "streams      stream 0, stream 7" in res.output
    res = runner.invoke(app, ["info", "--json", str(tmp_path / "t.parquet")])
    import json

    d = json.loads(res.stdout)
    assert d["ops"] == {"malloc": 2, "free": 2, "segment_alloc": 0, "segment_free": 0, "oom": 1}
    assert d["streams"] == [0, 7] and d["metadata"]["source"] == "cupy"


@pytest.mark.parametrize("name", ["truncated.parquet", "empty.parquet", "unknown_op.parquet"])
def test_info_subprocess_exit_code_and_no_traceback(tmp_path: Path, name: str) -> None:
    copy = tmp_path / name
    shutil.copy(DATA / name, copy)
    before = copy.read_bytes()
    res = subprocess.run([sys.executable, "-m", "tracekit", "info", str(copy)],
                         capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stderr.startswith("tracekit: error: ")
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert copy.read_bytes() == before


def test_usage_error_exits_2() -> None:
    res = subprocess.run([sys.executable, "-m", "tracekit", "info"], capture_output=True, text=True)
    assert res.returncode == 2


def test_help_does_not_import_heavy_modules() -> None:
    code = ("import sys; from tracekit.cli.app import app; "
            "bad = [m for m in ('cupy', 'torch', 'matplotlib', 'polars', 'numba') if m in sys.modules];"
            "print(','.join(bad))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""


def test_a_verb_parses_its_command_line_without_pydantic(tmp_path: Path) -> None:
    """typer 0.29 imports pydantic and builds an adapter per parameter on every command (0.08 s of a
    verb's start); the pin below it keeps every verb's start free of it (issue 45)."""
    code = ("import sys\n"
            "class Seen:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'pydantic':\n"
            "            print('pydantic imported', file=sys.stderr, flush=True)\n"
            "sys.meta_path.insert(0, Seen())\n"
            "from tracekit.cli.app import main\n"
            "sys.argv = ['tracekit', 'info', sys.argv[1]]\n"
            "main()\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing.parquet")], capture_output=True,
                         text=True)
    assert "no such file" in res.stderr and res.returncode != 0  # the verb ran and parsed its line
    assert "pydantic imported" not in res.stderr


def test_unfinished_recording_points_to_recover(tmp_path: Path) -> None:
    spool = tmp_path / "run.parquet.spool"
    spool.write_bytes(b"\xff" * 16)
    for target in (spool, tmp_path / "run.parquet"):
        with pytest.raises(InputError, match="did not finish; run 'tracekit recover"):
            read_trace(target)


def _two_devices(tmp_path: Path, dev: list[int], addr_shift: int = 0) -> Path:
    """Device 0's segment at S, device 1's at B; two blocks and their frees on the given devices."""
    s, b = 0x7F0000000000, 0x7F1000000000
    op = np.array([Op.SEGMENT_ALLOC, Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE], np.int8)
    addr = np.array([s, b, s + 512, b + 1024 + addr_shift, s + 512, b + 1024 + addr_shift], np.uint64)
    size = np.array([1 << 21, 1 << 21, 512, 1024, 512, 1024], np.uint64)
    ev = Events.build(op, size, addr=addr, device=np.array(dev, np.int16),
                      rounded=np.array([0, 0, 512, 1024, 0, 0], np.uint64))
    return write_trace(tmp_path / "two.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


def test_devices_that_contradict_each_other_are_caught(tmp_path: Path) -> None:
    ok = read_trace(_two_devices(tmp_path, [0, 1, 0, 1, 0, 1]))
    assert not ok.issues and len(ok.events) == 6
    # The recorder's bug: a malloc in device 1's segment labelled device 0.
    t = read_trace(_two_devices(tmp_path, [0, 1, 0, 0, 0, 1]))
    kinds = {i.kind.describe: (i.count, i.first_seq) for i in t.issues}
    assert kinds["malloc inside a segment of another device, none of its own (and its free)"] == (1, 3)
    # A free on another device than its malloc.
    t = read_trace(_two_devices(tmp_path, [0, 1, 0, 1, 0, 0]))
    assert any(i.kind.describe.startswith("free on another device") for i in t.issues)
    r = CliRunner().invoke(app, ["info", "--strict", str(tmp_path / "two.parquet")])
    assert r.exit_code == 1 and "inconsistent events (--strict)" in r.stderr


def _table_trace(tmp_path: Path, table_edit: object = None, meta_text: str | None = None,
                 **write: object) -> Path:
    import pyarrow.parquet as pq

    from tracekit.trace.schema import META_KEY

    base = write_trace(tmp_path / "base.parquet", TraceMeta.new(Source.SYNTHETIC), Events.build(
        np.zeros(5, np.int8), np.full(5, (1 << 60) - 1, np.uint64),  # five mallocs of 2^60 - 1
        addr=np.arange(5, dtype=np.uint64) << np.uint64(61)))
    t = pq.read_table(base)
    if callable(table_edit):
        t = table_edit(t)
    if meta_text is not None:
        t = t.replace_schema_metadata({META_KEY: meta_text})
    out = tmp_path / "t.parquet"
    pq.write_table(t, out, **write)
    return out


META = '{"schema_version": 1, "source": "cupy", '


@pytest.mark.parametrize(("make", "cause"), [
    (lambda p: _table_trace(p), "live bytes reach 2^62 or more at seq 4"),
    (lambda p: _table_trace(p, meta_text=META + '"pool_limit_bytes": Infinity}'), "Infinity is not a number"),
    (lambda p: _table_trace(p, meta_text=META + '"x": ' + "[" * 5000 + "]" * 5000 + "}"), "nested"),
    (lambda p: _table_trace(p, meta_text=META + '"pool_limit_bytes": -5}'),
     "pool_limit_bytes of -5 bytes is outside 0 .. 2^62"),
    (lambda p: _table_trace(p, lambda t: t.append_column("size", t.column("size"))),
     "appears more than once"),
    (lambda p: _table_trace(p, lambda t: t.append_column("initial", t.column("size"))),
     "extra column 'initial' has type uint64, expected bool"),
])
def test_hostile_values_are_refused_in_one_sentence(tmp_path: Path, make: object, cause: str) -> None:
    path = make(tmp_path)  # type: ignore[operator]
    with pytest.raises(InputError, match=re.escape(cause)):
        read_trace(path)


def _two_times(tmp_path: Path, t0: int, t1: int) -> Path:
    ev = Events.build(np.array([Op.MALLOC, Op.FREE], np.int8), np.array([512, 512], np.uint64),
                      addr=np.array([4096, 4096], np.uint64), t_ns=np.array([t0, t1], np.int64))
    return write_trace(tmp_path / "t.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


@pytest.mark.parametrize("t0, t1", [(-(2**63), -(2**63) + 5), (2**63 - 10, 2**63 - 1), (0, 2**62 - 1)])
def test_extreme_but_valid_times_are_read(tmp_path: Path, t0: int, t1: int) -> None:
    t = read_trace(_two_times(tmp_path, t0, t1))
    assert len(t.events) == 2
    assert int(t.events.t_ns[-1] - t.events.t_ns[0]) == t1 - t0  # the span is exact in int64


@pytest.mark.parametrize("t0, t1", [(-(2**63), 2**63 - 1), (0, 2**62), (-(2**61), 2**62 - 2**61)])
def test_a_time_span_past_2_62_ns_is_refused(tmp_path: Path, t0: int, t1: int) -> None:
    # t_ns[-1] - t_ns[0] would overflow int64 (a duration of -1 ns) or come close to it: 146 years.
    with pytest.raises(TraceFormatError, match=r"t_ns spans 2\^62 ns \(146 years\) or more"):
        read_trace(_two_times(tmp_path, t0, t1))


def test_tiny_row_groups_are_refused_not_read_slowly(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from tracekit.trace.reader import FREE_GROUPS

    n = FREE_GROUPS + 10
    ev = Events.build(np.zeros(n, np.int8), np.full(n, 512, np.uint64),
                      addr=np.arange(n, dtype=np.uint64) * 4096)
    src = write_trace(tmp_path / "a.parquet", TraceMeta.new(Source.SYNTHETIC), ev)
    pq.write_table(pq.read_table(src), tmp_path / "b.parquet", row_group_size=1)
    with pytest.raises(InputError, match="row groups for"):
        read_trace(tmp_path / "b.parquet")


def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "t.parquet"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        read_trace(fifo)
