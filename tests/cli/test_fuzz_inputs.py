"""Hostile inputs through every reading verb: the exit-code contract, no traceback, nothing touched.

Hypothesis builds traces (valid ones with one column or metadata value made
hostile: extreme integers, nulls, wrong types, deep or infinite JSON, duplicate
or mistyped extra columns), spools, snapshots (random plain-data pickles and
damaged real ones) and option values, and runs them through the verbs
in-process (typer's CliRunner) and, for a sample, through a subprocess whose
peak memory is measured. Every run must end with exit 0, 1, 2 or 3, print at
most one ``tracekit: error:`` line and no traceback, and leave every file
outside its named output as it was. ``TRACEKIT_FUZZ=long`` (used by
``scripts/fuzz_long.py``) runs many more examples.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.record.spool_format import SPOOL_KEY, SPOOL_SCHEMA
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.schema import META_KEY

ROOT = Path(__file__).resolve().parents[2]
LONG = os.environ.get("TRACEKIT_FUZZ") == "long"
FUZZ = settings(max_examples=400 if LONG else 12, deadline=None, derandomize=not LONG,
                suppress_health_check=list(HealthCheck))
MEMORY_BOUND = 900 << 20  # peak RSS of one CLI run on an input of a few KB (the interpreter is ~250 MB)

EXTREMES = [0, 1, -1, 2**15, 2**31 - 1, 2**53, 2**60, 2**62 - 1, 2**62, 2**63 - 1, 2**64 - 1, -(2**63)]
ints = st.one_of(st.sampled_from(EXTREMES), st.integers(-(2**64), 2**65))
json_scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=8))


def _json_text(v: Any) -> str:
    return json.dumps(v, allow_nan=True)


def base_events() -> Events:
    """A tiny valid trace: a segment, three blocks, two frees, an OOM."""
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.MALLOC, Op.OOM, Op.FREE], np.int8)
    seg, b = 0x7F0000000000, 0x7F0000000000
    addr = np.array([seg, b, b + 1024, b, b + 4096, 0, b + 1024], np.uint64)
    size = np.array([1 << 21, 1000, 2048, 1024, 512, 1 << 30, 2048], np.uint64)
    rounded = np.array([0, 1024, 2048, 0, 512, 1 << 30, 0], np.uint64)
    site = np.array([-1, 0, 1, -1, 0, 1, -1], np.int32)
    return Events.build(op, size, addr=addr, rounded=rounded, site=site,
                        sites=("train.py:10:step", "model.py:3:fwd"))


def base_table(tmp: Path) -> pa.Table:
    p = tmp / "base.parquet"
    if not p.exists():
        write_trace(p, TraceMeta.new(Source.SYNTHETIC, pool_limit_bytes=1 << 30), base_events())
    return pq.read_table(p)


@st.composite
def hostile_traces(draw: Any) -> tuple[str, Any]:
    """(kind, change): one thing in a valid trace made hostile."""
    kind = draw(st.sampled_from(["value", "null", "type", "meta", "meta_deep", "extra", "dup", "drop"]))
    col = draw(st.sampled_from(["seq", "t_ns", "addr", "size", "rounded", "stream", "device"]))
    if kind == "value":
        return kind, (col, draw(st.integers(0, 6)), draw(ints))
    if kind in ("null", "drop"):
        return kind, (col, draw(st.integers(0, 6)))
    if kind == "type":
        return kind, (col, draw(st.sampled_from(["string", "float64", "bool"])))
    if kind == "meta":
        key = draw(st.sampled_from(["schema_version", "source", "pool_limit_bytes", "device", "command",
                                    "versions", "torch_allocator_settings", "pools"]))
        return kind, (key, draw(st.one_of(json_scalars, st.lists(json_scalars, max_size=3),
                                          st.dictionaries(st.text(max_size=4), json_scalars, max_size=3))))
    if kind == "meta_deep":
        return kind, draw(st.integers(50, 200_000))
    if kind == "extra":
        name = draw(st.sampled_from(["initial", "expandable", "pool", "device_free", "stack", "input_seq"]))
        return kind, (name, draw(st.sampled_from(["string", "int64", "bool", "float64"])))
    return kind, col


def make_trace(tmp: Path, kind: str, change: Any) -> Path:
    t = base_table(tmp)
    meta = json.loads(t.schema.metadata[META_KEY.encode() if isinstance(META_KEY, str) else META_KEY])
    if kind == "value":
        col, row, v = change
        vals = t.column(col).to_pylist()
        vals[row] = v
        typ = pa.int64() if -(2**63) <= v < 2**63 else pa.uint64() if 0 <= v < 2**64 else pa.string()
        arr = pa.array([str(x) for x in vals] if typ == pa.string() else vals, type=typ)
        t = t.set_column(t.schema.get_field_index(col), col, arr)
    elif kind == "null":
        col, row = change
        vals = t.column(col).to_pylist()
        vals[row] = None
        t = t.set_column(t.schema.get_field_index(col), col, pa.array(vals, type=t.schema.field(col).type))
    elif kind == "drop":
        t = t.drop_columns([change[0]])
    elif kind == "type":
        col, typ = change
        t = t.set_column(t.schema.get_field_index(col), col, t.column(col).cast(pa.string()).cast(
            pa.string() if typ == "string" else pa.float64() if typ == "float64" else pa.string()))
    elif kind == "meta":
        meta[change[0]] = change[1]
    elif kind == "meta_deep":
        meta["deep"] = "__DEEP__"
    elif kind == "extra":
        name, typ = change
        n = t.num_rows
        arr = {"string": pa.array(["x"] * n), "int64": pa.array(range(n), pa.int64()),
               "bool": pa.array([True] * n), "float64": pa.array([0.5] * n)}[typ]
        t = t.append_column(name, arr)
    elif kind == "dup":
        t = t.append_column(change, t.column(change))
    text = _json_text(meta)
    if kind == "meta_deep":
        text = text.replace('"__DEEP__"', "[" * change + "]" * change)
    t = t.replace_schema_metadata({META_KEY: text})
    out = tmp / "hostile.parquet"
    pq.write_table(t, out)
    return out


@st.composite
def hostile_snapshots(draw: Any) -> bytes:
    """A pickle of plain data shaped like a snapshot, with hostile values; sometimes gzip'd."""
    value = st.recursive(json_scalars, lambda c: st.one_of(
        st.lists(c, max_size=3), st.dictionaries(st.text(max_size=6), c, max_size=3)), max_leaves=12)
    entry = st.fixed_dictionaries({
        "action": st.one_of(st.sampled_from(["alloc", "free_requested", "free_completed", "segment_alloc",
                                              "segment_free", "segment_map", "segment_unmap", "oom"]), value),
        "addr": ints, "size": ints, "stream": ints, "time_us": st.one_of(st.none(), ints),
        "frames": st.one_of(st.none(), st.lists(st.fixed_dictionaries(
            {"filename": st.text(max_size=6), "line": ints, "name": st.text(max_size=4)}), max_size=2)),
    })
    segment = st.fixed_dictionaries({
        "device": ints, "address": ints, "total_size": ints, "stream": ints, "is_expandable": st.booleans(),
        "blocks": st.lists(st.fixed_dictionaries({"size": ints, "address": ints, "state": value,
                                                  "requested_size": ints}), max_size=2),
    })
    snap = {
        "segments": draw(st.lists(segment, max_size=2)),
        "device_traces": draw(st.lists(st.lists(entry, max_size=6), max_size=2)),
        "allocator_settings": draw(value),
        "tracekit": draw(st.dictionaries(st.sampled_from(["allowed_bytes", "total_bytes", "device_name"]),
                                         json_scalars, max_size=3)),
    }
    data = pickle.dumps(snap, protocol=draw(st.integers(2, 5)))
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    data = data if cut is None else data[:cut]
    return gzip.compress(data) if draw(st.booleans()) else data


@st.composite
def hostile_spools(draw: Any) -> pa.Table:
    n = draw(st.integers(1, 6))
    codes = st.integers(-3, 6)
    cols: dict[str, Any] = {
        "t_ns": pa.array(draw(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
                                       min_size=n, max_size=n)), pa.int64()),
        "op": pa.array(draw(st.lists(st.one_of(st.none(), codes), min_size=n, max_size=n)), pa.int8()),
    }
    for name in ("addr", "size", "rounded", "stream"):
        cols[name] = pa.array(draw(st.lists(st.one_of(st.none(), st.integers(0, 2**64 - 1)),
                                            min_size=n, max_size=n)), pa.uint64())
    cols["device"] = pa.array(draw(st.lists(st.integers(-(2**15), 2**15 - 1), min_size=n, max_size=n)),
                              pa.int16())
    cols["site"] = pa.array(draw(st.lists(st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),
                                          min_size=n, max_size=n)), pa.int32())
    note = st.one_of(st.just('{"kind": "oom", "note": "x", "seq": "y"}'), st.just("[1, 2]"),
                     st.just("[" * 5000 + "]" * 5000), st.text(max_size=10))
    cols["text"] = pa.array(draw(st.lists(st.one_of(st.none(), note), min_size=n, max_size=n)), pa.string())
    cols["pool"] = pa.array([-1] * n, pa.int32())
    cols["device_free"] = pa.array([-1] * n, pa.int64())
    return pa.table(cols, schema=SPOOL_SCHEMA)


INT64_EXTREMES = [x for x in EXTREMES if -(2**63) <= x < 2**63]
text_records = st.one_of(
    st.builds(lambda i, n: json.dumps(["s", i, n]), ints, st.text(max_size=8)),
    st.builds(lambda i, f, ln, k: json.dumps(["f", i, f, ln, "fn", k]), ints, st.text(max_size=8), ints,
              ints),
    st.builds(lambda i, f, p: json.dumps(["k", i, f, p]), ints, ints, ints),
    st.builds(lambda i, v: json.dumps(["n", i, {"kind": "oom", "seq": v}]), ints, json_scalars),
    st.sampled_from(["[", "[1]", '["s"]', "{}", "[" * 3000 + "]" * 3000]), st.text(max_size=10))


@st.composite
def hostile_raw_spools(draw: Any) -> bytes:
    """Spool format 4: frames of hostile rows (any int64 in every slot) and text records, then maybe
    cut short or with a byte flipped."""
    from tracekit.record.spool_format import FRAME, MAGIC, META, ROWS, TEXT

    head = json.dumps({"meta": json.loads(TraceMeta.new(Source.CUPY).to_json()),
                       "t0_ns": draw(st.sampled_from([0, 1, 2**61]))}).encode()
    out = [MAGIC, FRAME.pack(META, 0, len(head)), head]
    for _ in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            lines = draw(st.lists(text_records, min_size=1, max_size=4))
            body = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
            out += [FRAME.pack(TEXT, len(lines), len(body)), body]
        else:
            n = draw(st.integers(1, 4))
            vals = draw(st.lists(st.one_of(st.sampled_from(INT64_EXTREMES),
                                           st.integers(-(2**63), 2**63 - 1)), min_size=8 * n, max_size=8 * n))
            body = struct.pack(f"<{8 * n}q", *vals)
            out += [FRAME.pack(ROWS, n, len(body)), body]
    data = b"".join(out)
    if draw(st.booleans()):
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    cut = draw(st.one_of(st.none(), st.integers(0, len(data))))
    return data if cut is None else data[:cut]


def write_spool(tmp: Path, table: pa.Table) -> Path:
    out = tmp / "rec.parquet.spool"
    meta = TraceMeta.new(Source.CUPY).to_json().encode()
    schema = table.schema.with_metadata({META_KEY: meta, SPOOL_KEY: b"1"})
    with pa.OSFile(str(out), "wb") as f, pa.ipc.new_stream(f, schema) as w:
        w.write_table(table.replace_schema_metadata(schema.metadata))
    return out


def snapshot_files(tmp: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in tmp.rglob("*") if p.is_file()}


def check_result(exit_code: int, stderr: str, exception: BaseException | None = None) -> None:
    """The exit-code contract: 0..3, one error line at most, never a traceback."""
    assert exception is None or isinstance(exception, SystemExit), repr(exception)
    assert exit_code in (0, 1, 2, 3), (exit_code, stderr)
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("tracekit: error:")]
    assert len(errors) == (0 if exit_code == 0 else 1) or exit_code == 3, stderr


def run_verbs(tmp: Path, path: Path, verbs: list[list[str]]) -> None:
    before = snapshot_files(tmp)
    out = tmp / "out.parquet"
    for verb in verbs:
        args = [a.replace("IN", str(path)).replace("OUT", str(out)) for a in verb]
        r = CliRunner().invoke(app, args)
        check_result(r.exit_code, r.stderr if hasattr(r, "stderr") else r.output, r.exception)
        out.unlink(missing_ok=True)
    assert snapshot_files(tmp) == before


def run_on_bytes(tmp: Path, name: str, data: bytes, verbs: list[list[str]]) -> None:
    """``run_verbs`` on a file ``name`` in ``tmp`` holding ``data``."""
    path = tmp / name
    path.write_bytes(data)
    run_verbs(tmp, path, verbs)


TRACE_VERBS = [["info", "IN"], ["info", "--strict", "--json", "IN"], ["analyze", "IN", "--json"],
               ["replay", "IN", "--sim", "first-fit", "-o", "OUT"], ["replay", "IN", "--sim", "cupy"],
               ["replay", "IN", "--sim", "torch", "--fail-on-oom"]]
if LONG:  # the slower verbs (figures, searches, parallel processes) in the long run only
    TRACE_VERBS += [["report", "IN", "-o", "OUT"], ["whatif", "IN", "--json"], ["advise", "IN"],
                    ["fleet", "IN"], ["analyze", "IN", "--timeline", "OUT"]]


@FUZZ
@given(case=hostile_traces())
def test_hostile_traces_through_every_reading_verb(tmp_path_factory: Any, case: tuple[str, Any]) -> None:
    tmp = tmp_path_factory.mktemp("trace")
    run_verbs(tmp, make_trace(tmp, *case), TRACE_VERBS)


@FUZZ
@given(data=hostile_snapshots())
def test_hostile_snapshots_import_or_are_refused(tmp_path_factory: Any, data: bytes) -> None:
    run_on_bytes(tmp_path_factory.mktemp("snap"), "s.pickle", data, [["import", "torch", "IN", "-o", "OUT"]])


@FUZZ
@given(table=hostile_spools())
def test_hostile_spools_recover_or_are_refused(tmp_path_factory: Any, table: pa.Table) -> None:
    tmp = tmp_path_factory.mktemp("spool")
    run_verbs(tmp, write_spool(tmp, table), [["recover", "IN", "-o", "OUT"]])


@FUZZ
@given(data=hostile_raw_spools())
def test_hostile_format_4_spools_recover_or_are_refused(tmp_path_factory: Any, data: bytes) -> None:
    tmp = tmp_path_factory.mktemp("spool4")
    run_on_bytes(tmp, "rec.parquet.spool", data, [["recover", "IN", "-o", "OUT"]])


option_values = st.one_of(st.sampled_from(["1e400", "-1", "0", "nan", "inf", str(2**63), str(2**64), "1e20",
                                           "6GiB", "1.5GB", "", " ", "\x00", "[", "a:b,c"]),
                          st.text(max_size=12))


@FUZZ
@given(size=option_values, conf=option_values, n=option_values)
def test_hostile_option_values(tmp_path_factory: Any, size: str, conf: str, n: str) -> None:
    tmp = tmp_path_factory.mktemp("opt")
    trace = tmp / "t.parquet"
    write_trace(trace, TraceMeta.new(Source.SYNTHETIC), base_events())
    run_verbs(tmp, trace, [
        ["replay", "IN", "--sim", "cupy", "--capacity", size],
        ["replay", "IN", "--sim", "torch", "--torch-conf", conf, "--device-total", size],
        ["synth", "-p", "random", "-n", n, "--seed", n, "-o", "OUT"],
        ["report", "IN", "--whatif-json", str(tmp / "nope.json"), "-o", "OUT"],
    ])


def _deep_json(tmp: Path) -> Path:
    p = tmp / "w.json"
    p.write_text("[" * 100_000 + "]" * 100_000)
    return p


def test_deep_side_files_and_outputs_that_are_inputs(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(trace, TraceMeta.new(Source.SYNTHETIC), base_events())
    w = _deep_json(tmp_path)
    (tmp_path / "png").mkdir()
    os.link(trace, tmp_path / "png" / "timeline.png")
    run_verbs(tmp_path, trace, [
        ["report", "IN", "--whatif-json", str(w), "-o", str(tmp_path / "r.html")],
        ["report", "IN", "--whatif-json", str(w), "-o", str(w), "--force"],
        ["report", "IN", "-o", str(tmp_path / "r.html"), "--png", str(tmp_path / "png"), "--force"],
        ["analyze", "IN", "--timeline", str(tmp_path / "png" / "timeline.png"), "--force"],
        ["replay", "IN", "--sim", "cupy", "-o", "/dev/null", "--force"],
    ])


# The verb runs in a child of a small wrapper: a process forked from this one (pytest's, hundreds of
# MiB by now) starts with this one's peak resident set as its own, whatever it does after exec.
_WRAPPER = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def run_cli(args: list[str], cwd: Path) -> tuple[int, str, int]:
    """(exit code, stderr, peak RSS in bytes) of ``tracekit ARGS`` in a fresh interpreter."""
    res = subprocess.run([sys.executable, "-c", _WRAPPER, sys.executable, "-m", "tracekit.cli.app", *args],
                         cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                         timeout=600)
    rc, kib = res.stdout.split()
    return int(rc), res.stderr, int(kib) * 1024


@pytest.mark.parametrize("kind", ["snapshot", "trace"])
def test_subprocess_exit_codes_and_memory(tmp_path: Path, kind: str) -> None:
    """A few hostile inputs in a fresh process: exit code, one line, and peak memory."""
    if kind == "snapshot":
        bad = tmp_path / "memo.pickle"
        bad.write_bytes(b"\x80\x02N" + b"r" + (1 << 27).to_bytes(4, "little") + b".")  # memo index 2^27
        args = ["import", "torch", str(bad), "-o", str(tmp_path / "o.parquet")]
    else:
        bad = make_trace(tmp_path, "meta_deep", 100_000)
        args = ["analyze", str(bad)]
    code, err, rss = run_cli(args, tmp_path)
    check_result(code, err)
    assert code == 1 and rss < MEMORY_BOUND, (code, err, rss)
