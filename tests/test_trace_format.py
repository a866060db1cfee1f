"""Trace format v1: round trips, and the exact sentence for every invalid input."""

from __future__ import annotations

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

DATA = Path(__file__).parent / "data"

BAD = {
    "missing_column.parquet": "missing required column 'size'",
    "wrong_type.parquet": "column 'size' has type string, expected an integer type",
    "seq_not_increasing.parquet": "seq is not strictly increasing at seq 2 (after 2)",
    "t_ns_decreasing.parquet": "t_ns decreases at seq 2",
    "unknown_op.parquet": "unknown op 'calloc' at seq 1",
    "missing_size.parquet": "missing size at seq 1 (malloc row)",
    "missing_addr.parquet": "missing addr at seq 1 (malloc row)",
    "bad_version.parquet": "unsupported schema_version 3 (this tracekit reads versions 1 and 2)",
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


def test_unfinished_recording_points_to_recover(tmp_path: Path) -> None:
    spool = tmp_path / "run.parquet.spool"
    spool.write_bytes(b"\xff" * 16)
    for target in (spool, tmp_path / "run.parquet"):
        with pytest.raises(InputError, match="did not finish; run 'tracekit recover"):
            read_trace(target)
