"""Trace format v3 on disk: the ``stack`` column and the ``tracekit.stacks`` key, worked by hand.

A round trip keeps every stack; traces of formats 1 and 2 read as one-frame stacks; every hostile
stack table or stack id is refused in one sentence that names the file and the cause.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tracekit.errors import InputError, TraceFormatError
from tracekit.trace import Events, Op, Source, TraceMeta, read_meta, read_trace, write_trace
from tracekit.trace import stacks as stacks_module
from tracekit.trace.stacks import FrameKind, StackTable
from tracekit.trace.writer import TraceWriter

DATA = Path(__file__).resolve().parents[1] / "data"
TRACES = Path(__file__).resolve().parents[2] / "traces"
KEY = b"tracekit.stacks"

# Frames: 0 train.py:10 step, 1 model.py:5 forward, 2 cupy/_creation/basic.py:31 empty (a library).
# Stacks: 0 = step; 1 = forward <- step; 2 = empty <- forward <- step; 3 = empty <- step.
TABLE = StackTable.build(["train.py", "model.py", "cupy/_creation/basic.py"], [10, 5, 31],
                         ["step", "forward", "empty"], [0, 0, 1], [0, 1, 2, 2], [-1, 0, 1, 0])


def events(stack: list[int] | None = None, table: StackTable | None = TABLE) -> Events:
    """malloc A (stack 2), malloc B (stack 3), free A, oom (stack 2), free B."""
    return Events.build(
        op=np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM, Op.FREE], np.int8),
        size=np.array([512, 1024, 512, 1 << 30, 1024], np.uint64),
        addr=np.array([0x1000, 0x2000, 0x1000, 0, 0x2000], np.uint64),
        rounded=np.array([512, 1024, 0, 1 << 30, 0], np.uint64),
        site=np.array([0, 1, -1, 0, -1], np.int32), sites=("model.py:5:forward", "train.py:10:step"),
        stack=np.array(stack if stack is not None else [2, 3, -1, 2, -1], np.int32), stacks=table,
    )


def test_round_trip_keeps_each_event_stack_and_the_site_column(tmp_path: Path) -> None:
    write_trace(tmp_path / "t.parquet", TraceMeta.new(Source.SYNTHETIC), events())
    t = read_trace(tmp_path / "t.parquet", strict=True)
    ev = t.events
    assert t.meta.schema_version == 3 and read_meta(tmp_path / "t.parquet").schema_version == 3
    assert ev.stack.tolist() == [2, 3, -1, 2, -1]
    assert [f.label() for f in ev.stacks.frames(int(ev.stack[0]))] == [
        "cupy/_creation/basic.py:31:empty", "model.py:5:forward", "train.py:10:step"]
    assert [f.short() for f in ev.stacks.frames(int(ev.stack[1]))] == ["cupy/_creation/basic.py:31",
                                                                        "train.py:10"]
    assert [f.kind for f in ev.stacks.frames(2)] == [FrameKind.LIBRARY, FrameKind.USER, FrameKind.USER]
    assert ev.stacks.to_json() == TABLE.to_json()
    # the one-frame site column is as before, for readers of format 2
    assert [ev.site_name(i) for i in range(5)] == ["model.py:5:forward", "train.py:10:step", None,
                                                   "model.py:5:forward", None]
    assert t.extras is None  # `stack` is a column of the format, not an extra
    raw = pq.read_table(tmp_path / "t.parquet")
    assert raw.schema.field("stack").type == pa.int32() and raw.column("stack").null_count == 2
    assert "site" in raw.schema.names


def test_batches_with_their_own_tables_are_merged_into_one(tmp_path: Path) -> None:
    other = StackTable.build(["x.py", "train.py"], [1, 10], ["f", "step"], [0, 0], [1, 0], [-1, 0])
    with TraceWriter(tmp_path / "t.parquet", TraceMeta.new(Source.SYNTHETIC)) as w:
        w.write(events().take(slice(0, 3)))
        # its stack 1 is x.py:f <- train.py:step, new; its stack 0 is train.py:step, stack 0 of TABLE
        second = Events.build(op=np.array([Op.MALLOC, Op.MALLOC], np.int8),
                              size=np.array([64, 64], np.uint64),
                              addr=np.array([0x3000, 0x4000], np.uint64), seq=np.array([3, 4], np.uint64),
                              t_ns=np.array([3, 4], np.int64), stack=np.array([1, 0], np.int32), stacks=other)
        w.write(second)
    ev = read_trace(tmp_path / "t.parquet").events
    assert ev.stack.tolist() == [2, 3, -1, 4, 0]
    assert ev.stacks.n_stacks == 5 and ev.stacks.n_frames == 4
    assert [f.label() for f in ev.stacks.frames(4)] == ["x.py:1:f", "train.py:10:step"]


@pytest.mark.parametrize("name,version", [("cupy-user-pool", 2), ("cupy-mlp", 1)])
def test_a_recorded_trace_of_format_1_or_2_reads_as_one_frame_stacks(name: str, version: int) -> None:
    t = read_trace(TRACES / f"{name}.parquet")
    ev = t.events
    assert t.meta.schema_version == version
    np.testing.assert_array_equal(ev.stack, ev.site)
    assert ev.stacks.n_stacks == len(ev.sites)
    i = int(np.flatnonzero(ev.site >= 0)[0])
    (frame,) = ev.stacks.frames(int(ev.stack[i]))
    assert frame.label() == ev.site_name(i)


def test_a_format_1_trace_reads_as_one_frame_stacks() -> None:
    t = read_trace(DATA / "valid_small.parquet")
    assert t.meta.schema_version == 1
    np.testing.assert_array_equal(t.events.stack, t.events.site)
    assert t.events.stacks.n_stacks == len(t.events.sites)


def _with(tmp_path: Path, stacks_json: bytes | None, stack: pa.Array | None = None,
          drop_stack: bool = False) -> Path:
    """The round-trip trace rewritten with ``stacks_json`` under the key (None: no key) and, if
    given, ``stack`` as its stack column."""
    write_trace(tmp_path / "ok.parquet", TraceMeta.new(Source.SYNTHETIC), events())
    table = pq.read_table(tmp_path / "ok.parquet")
    if stack is not None:
        table = table.set_column(table.schema.get_field_index("stack"), "stack", stack)
    if drop_stack:
        table = table.drop_columns(["stack"])
    meta = {b"tracekit": pq.read_metadata(tmp_path / "ok.parquet").metadata[b"tracekit"]}
    if stacks_json is not None:
        meta[KEY] = stacks_json
    out = tmp_path / "bad.parquet"
    pq.write_table(table.replace_schema_metadata(meta), out)
    return out


GOOD = TABLE.to_json()


def _edit(**parts: object) -> bytes:
    d = json.loads(json.dumps(GOOD))
    for path, value in parts.items():
        section, _, name = path.partition("__")
        if name:
            d[section][name] = value
        else:
            d[section] = value
    return json.dumps(d).encode()


HOSTILE = [
    (b"{", "the 'tracekit.stacks' metadata is not valid JSON"),
    (b"[1, 2]", "the 'tracekit.stacks' metadata is not a stack table: it is not a JSON object"),
    (b'{"stacks": {}}', "is not a stack table: 'frames' is not a JSON object"),
    (_edit(frames__file="train.py"), "is not a stack table: 'frames.file' is not a list"),
    (_edit(frames__file=["train.py", 7, "c.py"]), "'frames.file' holds a value that is not a string"),
    (_edit(frames__line=[10, "5", 31]), "'frames.line' holds a value that is not a whole number"),
    (_edit(frames__line=[10, 5.0, 31]), "'frames.line' holds a value that is not a whole number"),
    (_edit(frames__kind=[0, True, 1]), "'frames.kind' holds a value that is not a whole number"),
    (_edit(frames__kind=[0, 0, 9]), "'frames.kind' holds a value outside 0 .. 3"),
    (_edit(frames__line=[10, -2, 31]), "'frames.line' holds a value outside -1 .. 2147483647"),
    (_edit(frames__function=["step", "forward"]), "the frame table's columns differ in length"),
    (_edit(stacks__parent=[-1, 0, 1]), "the stack table's columns differ in length"),
    (_edit(stacks__frame=[0, 1, 2, 3]), "a stack names a frame that is not in the frame table"),
    (_edit(stacks__parent=[-1, 1, 1, 0]), "a stack's parent is not an earlier stack"),
    (_edit(stacks__parent=[-1, 0, 3, 0]), "a stack's parent is not an earlier stack"),
    (_edit(stacks__parent=[-1, -5, 1, 0]), "'stacks.parent' holds a value outside -1 .. 4194304"),
    (_edit(frames__file=["x" * 20_000, "model.py", "c.py"]),
     "a frame's file or function is 20,000 bytes, more than 16,384"),
    (b"[" * 100 + b"]" * 100, "the 'tracekit.stacks' metadata is nested more than 64 levels deep"),
]


@pytest.mark.parametrize("raw,cause", HOSTILE, ids=[c for _, c in HOSTILE])
def test_a_hostile_stack_table_is_refused_in_one_sentence(tmp_path: Path, raw: bytes, cause: str) -> None:
    bad = _with(tmp_path, raw)
    with pytest.raises(TraceFormatError) as err:
        read_trace(bad)
    text = str(err.value)
    assert text.startswith(f"{bad}: ") and cause in text and "\n" not in text


def test_a_table_beyond_the_entry_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks_module, "MAX_ENTRIES", 3)  # 4 stacks in TABLE
    with pytest.raises(TraceFormatError, match=r"'stacks.frame' has 4 entries, more than 3$"):
        read_trace(_with(tmp_path, json.dumps(GOOD).encode()))


def test_a_table_of_too_much_text_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stacks_module, "MAX_TABLE_TEXT_BYTES", 40)  # TABLE: 39 bytes of paths, 16 of names
    with pytest.raises(TraceFormatError, match=r"its frames hold 55 bytes of text, more than 40$"):
        read_trace(_with(tmp_path, json.dumps(GOOD).encode()))


def test_a_stack_id_beyond_the_table_is_refused_with_its_seq(tmp_path: Path) -> None:
    bad = _with(tmp_path, json.dumps(GOOD).encode(), pa.array([2, 7, None, 2, None], pa.int32()))
    with pytest.raises(TraceFormatError, match=r"column 'stack' names stack 7 at seq 1, but the "
                                               r"'tracekit.stacks' table holds 4$"):
        read_trace(bad)
    bad = _with(tmp_path, json.dumps(GOOD).encode(), pa.array([2, -3, None, 2, None], pa.int32()))
    with pytest.raises(TraceFormatError, match="names stack -3 at seq 1"):
        read_trace(bad)


def test_stack_ids_without_a_table_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"column 'stack' names stack 2 at seq 0, but the file has "
                                               r"no 'tracekit.stacks' metadata$"):
        read_trace(_with(tmp_path, None))


def test_a_stack_column_of_another_type_is_refused_on_open(tmp_path: Path) -> None:
    bad = _with(tmp_path, json.dumps(GOOD).encode(), pa.array([2.0, 3.0, None, 2.0, None], pa.float64()))
    with pytest.raises(InputError, match=r"extra column 'stack' has type double, expected stack ids"):
        read_trace(bad)


SITES_AS_STACKS = [["model.py:5:forward"], ["train.py:10:step"], [], ["model.py:5:forward"], []]


def _labels(ev: Events) -> list[list[str]]:
    return [[f.label() for f in ev.stacks.frames(int(s))] for s in ev.stack]


@pytest.mark.parametrize("stack", [None, pa.nulls(5), pa.nulls(5, pa.int32()),
                                   pa.array([None, -1, None, -1, None], pa.int64())],
                         ids=["dropped", "null type", "all null", "null and -1"])
def test_a_table_whose_stack_column_names_no_stack_keeps_the_sites_as_one_frame_stacks(
        tmp_path: Path, stack: pa.Array | None) -> None:
    """The key kept, the column dropped or emptied (a tool that rewrote the file): the call-sites the
    ``site`` column holds stand as one-frame stacks, as for formats 1 and 2, not no stack at all."""
    path = _with(tmp_path, json.dumps(GOOD).encode(), stack, drop_stack=stack is None)
    ev = read_trace(path, strict=True).events
    np.testing.assert_array_equal(ev.stack, ev.site)
    assert _labels(ev) == SITES_AS_STACKS


def test_a_stack_column_naming_one_stack_keeps_the_table(tmp_path: Path) -> None:
    ev = read_trace(_with(tmp_path, json.dumps(GOOD).encode(),
                          pa.array([None, 3, None, None, None], pa.int32()))).events
    assert ev.stack.tolist() == [-1, 3, -1, -1, -1] and ev.stacks.n_stacks == 4


@pytest.mark.parametrize("typ", [pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()], ids=str)
def test_unsigned_stack_ids_read_as_the_same_stacks(tmp_path: Path, typ: pa.DataType) -> None:
    ids = pa.array([2, 3, None, 2, None], typ)  # polars may write valid ids unsigned
    ev = read_trace(_with(tmp_path, json.dumps(GOOD).encode(), ids), strict=True).events
    assert ev.stack.dtype == np.int32 and ev.stack.tolist() == [2, 3, -1, 2, -1]
    assert [f.function for f in ev.stacks.frames(int(ev.stack[0]))] == ["empty", "forward", "step"]


@pytest.mark.parametrize("value", [4, 1 << 31, (1 << 32) - 1, (1 << 64) - 1])
def test_an_unsigned_stack_id_beyond_the_table_is_refused(tmp_path: Path, value: int) -> None:
    typ = pa.uint64() if value >= 1 << 32 else pa.uint32()
    bad = _with(tmp_path, json.dumps(GOOD).encode(), pa.array([2, value, None, 2, None], typ))
    with pytest.raises(TraceFormatError) as err:
        read_trace(bad)
    assert str(err.value) == (f"{bad}: column 'stack' names stack {value} at seq 1, but the "
                              "'tracekit.stacks' table holds 4")


def test_info_and_analyze_read_a_synthetic_trace_whose_stack_column_is_uint32(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from tracekit.cli.app import app

    synth = ["synth", "-p", "training", "-n", "2000", "-o", str(tmp_path / "T.parquet")]
    made = CliRunner().invoke(app, synth)
    assert made.exit_code == 0, made.output
    table = pq.read_table(tmp_path / "T.parquet")
    meta = pq.read_metadata(tmp_path / "T.parquet").metadata
    ids = table.column("stack").cast(pa.uint32())
    cast = table.set_column(table.schema.get_field_index("stack"), "stack", ids)
    kept = {k: meta[k] for k in (b"tracekit", KEY)}  # the stack table's key kept
    pq.write_table(cast.replace_schema_metadata(kept), tmp_path / "U.parquet")
    for verb in ("info", "analyze"):
        res = CliRunner().invoke(app, [verb, str(tmp_path / "U.parquet")])
        assert res.exit_code == 0 and res.exception is None, res.output
    a, b = read_trace(tmp_path / "T.parquet").events, read_trace(tmp_path / "U.parquet").events
    np.testing.assert_array_equal(a.stack, b.stack)
