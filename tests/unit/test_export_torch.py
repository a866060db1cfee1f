"""``export --format torch-snapshot``: the pickle, its shape, and tracekit's own importer reading it back.

The pickle is written opcode by opcode (``tracekit.export.pickle_writer``); Python's unpickler is
the reference for every value, and ``tracekit import torch`` (the restricted unpickler and the
compiled scanner both) must give back the trace's own events.
"""

from __future__ import annotations

import io
import itertools
import pickle
import pickletools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.export import torch_snapshot
from tracekit.export.pickle_writer import (
    Kind,
    Memo,
    Ref,
    Writer,
    entry_names,
    int_bytes,
    plain_blob,
    write_entries,
)
from tracekit.export.run import Format, export_file
from tracekit.importers.torch_snapshot import import_snapshot
from tracekit.trace import Events, Op, Source, Trace, TraceMeta, read_trace, write_trace

# The opcodes PyTorch MemoryViz's JavaScript unpickler handles (torch/utils/viz/MemoryViz.js).
MEMORY_VIZ_OPCODES = {
    "PROTO", "APPEND", "APPENDS", "LIST", "TUPLE", "NEWFALSE", "NEWTRUE", "NONE", "BINGET", "BININT",
    "BININT1", "BININT2", "EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE",
    "BINPUT", "LONG_BINPUT", "SETITEMS", "SETITEM", "DICT", "SHORT_BINUNICODE", "BINUNICODE", "STOP",
    "EMPTY_TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "BINFLOAT",
}
EDGES = [0, 1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32, 2**40 + 7, 2**55, 2**63 - 1, 2**63, 2**64 - 1]
NEGATIVE = [-1, -255, -(2**31), -(2**31) - 1, -(2**39), -(2**39) - 1, -(2**40), -(2**63), -(2**63) - 1]
MiB = 1 << 20
BASE = 0x7F00_0000_0000
SITES = ("train.py:10:step", "model.py:20:forward")


@pytest.mark.parametrize("v", EDGES + NEGATIVE)
def test_every_integer_form_reads_back_as_python_writes_it(v: int) -> None:
    assert pickle.loads(b"\x80\x04" + int_bytes(v) + b".") == v
    python = pickle.dumps(v, 4)[2:-1]
    assert int_bytes(v) == (python[9:] if python[:1] == b"\x95" else python)  # less Python's FRAME header


def entries_bytes(cols: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The entries the compiled writer makes of ``cols``, unpickled by Python, inside a list."""
    f = io.BytesIO()
    memo = Memo()
    names = entry_names(memo)
    empty = memo.item(("frames", -1), b"]")
    cols = {**cols, "frames": np.full(len(cols["kind"]), empty, np.int64)}
    w = Writer(f, memo)
    w.raw(b"]")
    write_entries(w, cols, names)
    w.end()
    data = f.getvalue()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= MEMORY_VIZ_OPCODES
    out: list[dict[str, Any]] = pickle.loads(data)
    return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(list(Kind)), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
                          st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1),
                          st.integers(-(2**63), 2**63 - 1)), max_size=2500))
def test_compiled_entries_equal_what_python_unpickles(
        rows: list[tuple[Kind, int, int, int, int, int]]) -> None:
    cols = {name: np.array([r[i] for r in rows], dtype) for i, (name, dtype) in enumerate(
        [("kind", np.int64), ("addr", np.uint64), ("size", np.uint64), ("stream", np.uint64),
         ("time_us", np.int64), ("device_free", np.int64)])}
    got = entries_bytes(cols)
    want = []
    for k, addr, size, stream, t, free in rows:
        e: dict[str, Any] = {"action": k.action, "size": size, "stream": stream, "time_us": t,
                             "compile_context": "N/A", "user_metadata": "", "frames": []}
        e.update({"device_free": free} if k is Kind.OOM else {"addr": addr})
        want.append(e)
    assert got == want
    assert all(a["frames"] is b["frames"] for a, b in itertools.pairwise(got))  # one shared list


def pooled_trace(path: Path) -> Path:
    """Two segments (one freed), blocks, a handled and a fatal OOM, two streams, two call-sites."""
    rows = [  # op, addr, size, rounded, site, stream
        (Op.SEGMENT_ALLOC, BASE, 4 * MiB, 0, -1, 0),
        (Op.MALLOC, BASE, 1000, 1024, 0, 0),
        (Op.MALLOC, BASE + 1024, MiB, MiB, 1, 0),
        (Op.MALLOC, BASE + 1024 + MiB, 4096, 4096, 1, 0),
        (Op.SEGMENT_ALLOC, BASE + 8 * MiB, 2 * MiB, 0, -1, 7),
        (Op.MALLOC, BASE + 8 * MiB, 2 * MiB, 2 * MiB, 0, 7),
        (Op.FREE, BASE + 1024, MiB, 0, -1, 0),
        (Op.OOM, 0, 64 * MiB, 64 * MiB, 1, 0),
        (Op.FREE, BASE + 8 * MiB, 2 * MiB, 0, -1, 7),
        (Op.SEGMENT_FREE, BASE + 8 * MiB, 2 * MiB, 0, -1, 7),
        (Op.MALLOC, BASE + 2 * MiB, 512, 512, -1, 0),
        (Op.OOM, 0, 128 * MiB, 128 * MiB, 0, 0),
    ]
    op, addr, size, rounded, site, stream = (np.array(c) for c in zip(*rows, strict=True))
    ev = Events.build(op=op, size=size, addr=addr, rounded=rounded, site=site, stream=stream,
                      t_ns=1_234_567 + np.arange(len(op)) * 1500, sites=SITES)
    free = np.full(len(op), -1, np.int64)
    free[op == Op.OOM] = [3 * MiB, 5 * MiB]
    write_trace(path, TraceMeta.new(Source.CUPY, pool_limit_bytes=6 * MiB), ev,
                {"device_free": pa.array(free, pa.int64(), mask=free < 0)},
                (pa.field("device_free", pa.int64()),))
    return path


def snapshot_of(trace: Path, out: Path) -> dict[str, Any]:
    export_file(trace, Format.TORCH_SNAPSHOT, out)
    data = out.read_bytes()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= MEMORY_VIZ_OPCODES
    snap: dict[str, Any] = pickle.loads(data)
    return snap


def test_the_snapshot_of_a_hand_built_trace(tmp_path: Path) -> None:
    snap = snapshot_of(pooled_trace(tmp_path / "p.parquet"), tmp_path / "p.pickle")
    assert list(snap) == ["segments", "device_traces", "tracekit"]
    hist = snap["device_traces"][0]
    assert [e["action"] for e in hist] == [
        "segment_alloc", "alloc", "alloc", "alloc", "segment_alloc", "alloc", "free_requested",
        "free_completed", "oom", "free_requested", "free_completed", "segment_free", "alloc", "oom"]
    assert [e["time_us"] for e in hist[:3]] == [1234, 1236, 1237]  # floor(t_ns / 1000)
    assert hist[6]["size"] == hist[7]["size"] == MiB  # a free carries its block's request
    assert (hist[8]["size"], hist[8]["device_free"], "addr" in hist[8]) == (64 * MiB, 3 * MiB, False)
    assert hist[1]["frames"] == [{"filename": "train.py", "line": 10, "name": "step"}]
    assert hist[1]["frames"] is hist[5]["frames"] and hist[0]["frames"] == []  # shared, as PyTorch's are
    assert hist[4]["stream"] == 7
    (seg,) = snap["segments"]  # the 2 MiB segment was freed
    assert (seg["address"], seg["total_size"], seg["device"], seg["stream"]) == (BASE, 4 * MiB, 0, 0)
    blocks = [(b["address"] - BASE, b["size"], b["state"], b["requested_size"]) for b in seg["blocks"]]
    assert blocks == [(0, 1024, "active_allocated", 1000), (1024, MiB, "inactive", 0),
                      (1024 + MiB, 4096, "active_allocated", 4096),
                      (1024 + MiB + 4096, MiB - 1024 - 4096, "inactive", 0),
                      (2 * MiB, 512, "active_allocated", 512), (2 * MiB + 512, 2 * MiB - 512, "inactive", 0)]
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    assert seg["allocated_size"] == seg["active_size"] == 1024 + 4096 + 512
    assert seg["blocks"][0]["frames"] is hist[1]["frames"]
    assert snap["tracekit"]["allowed_bytes"] == 6 * MiB and snap["tracekit"]["source"] == "cupy"


def same_events(a: Trace, b: Trace) -> None:
    """``b`` (imported from the export of ``a``) holds ``a``'s events: what a snapshot keeps of them."""
    x, y = a.events, b.events
    assert len(x) == len(y)
    oom = x.op == Op.OOM
    for col in ("op", "rounded", "stream", "device"):
        assert np.array_equal(getattr(x, col), getattr(y, col)), col
    assert np.array_equal(np.where(oom, 0, x.addr), np.where(oom, 0, y.addr))
    size = np.where(oom, x.rounded, x.size)  # an OOM keeps its rounded request
    freed = (x.op == Op.FREE) & (a.mate >= 0)
    size[freed] = x.rounded[a.mate[freed]]  # a free its block's bytes, as the importer pairs them
    assert np.array_equal(size, y.size)
    assert np.array_equal(1000 * (x.t_ns // 1000 - x.t_ns[0] // 1000), y.t_ns)  # microseconds from the first
    assert [x.site_name(i) for i in range(len(x))] == [y.site_name(i) for i in range(len(y))]
    assert np.array_equal(a.mate >= 0, b.mate >= 0)
    same_stacks(x, y)


def same_stacks(x: Events, y: Events) -> None:
    """Event by event, the imported stack has the original's frames (file, line, function)."""
    def frames(ev: Events, s: int) -> list[tuple[str, int, str]]:
        return [(f.file, max(f.line, 0), f.function) for f in ev.stacks.frames(s)]

    pairs = np.unique(np.stack([x.stack.astype(np.int64), y.stack.astype(np.int64)]), axis=1)
    for s, t in pairs.T.tolist():
        assert frames(x, s) == frames(y, t), (s, t)


@pytest.mark.parametrize("fast", [False, True], ids=["unpickler", "scanner"])
def test_the_importer_reads_back_the_hand_built_trace(tmp_path: Path, fast: bool) -> None:
    path = pooled_trace(tmp_path / "p.parquet")
    export_file(path, Format.TORCH_SNAPSHOT, tmp_path / "p.pickle")
    result = import_snapshot(tmp_path / "p.pickle", tmp_path / "back.parquet", fast=fast)
    assert result.initial_rows == 0 and result.skipped == {}
    back = read_trace(tmp_path / "back.parquet")
    same_events(read_trace(path), back)
    assert back.meta.pool_limit_bytes == 6 * MiB
    free = back.extras.column("device_free").to_pylist() if back.extras is not None else []
    assert [f for f in free if f is not None] == [3 * MiB, 5 * MiB]


COMMITTED = ["cupy-mlp", "cupy-fft", "cupy-sort", "cupy-oom-frag", "cupy-seed", "cupy-user-pool",
             "cupy-async", "torch-handled-oom", "torch-tuned", "torch-expandable"]


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_traces_read_back_to_the_same_events(name: str, traces_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_snapshot, "CHUNK", 1000)  # many passes of the compiled writer
    src = traces_dir / f"{name}.parquet"
    export_file(src, Format.TORCH_SNAPSHOT, tmp_path / "s.pickle")
    for fast in (False, True):
        out = tmp_path / f"back-{fast}.parquet"
        result = import_snapshot(tmp_path / "s.pickle", out, fast=fast)
        assert result.initial_rows == 0 and result.skipped == {}
        back = read_trace(out)
        same_events(read_trace(src), back)
    original = read_trace(src).meta
    assert back.meta.device == original.device and back.meta.pool_limit_bytes == original.pool_limit_bytes
    grows = torch_snapshot.expandable_rows(read_trace(src))
    if grows is not None:  # expandable cells travel as segment_map / segment_unmap and read back so
        assert np.array_equal(torch_snapshot.expandable_rows(back), grows)
    if original.source is Source.TORCH:  # PyTorch's settings travel, so its rounding reads back the same
        assert back.meta.extra["torch_allocator_settings"] == original.extra["torch_allocator_settings"]


def test_each_device_has_its_history_and_its_segments(tmp_path: Path) -> None:
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.SEGMENT_ALLOC, Op.MALLOC])
    ev = Events.build(op=op, size=np.array([2 * MiB, 4096, 2 * MiB, 8192]),
                      rounded=np.array([0, 4096, 0, 8192]), addr=np.array([BASE, BASE, BASE, BASE + 4096]),
                      device=np.array([0, 0, 2, 2]), site=np.array([-1, 0, -1, 1]), sites=SITES)
    path = tmp_path / "dev.parquet"
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), ev)
    snap = snapshot_of(path, tmp_path / "dev.pickle")
    assert [len(t) for t in snap["device_traces"]] == [2, 0, 2]
    assert [(s["device"], [b["state"] for b in s["blocks"]]) for s in snap["segments"]] == [
        (0, ["active_allocated", "inactive"]), (2, ["inactive", "active_allocated", "inactive"])]
    back = import_snapshot(tmp_path / "dev.pickle", tmp_path / "back.parquet")
    assert back.devices == (0, 2) and back.initial_rows == 0


def test_a_raw_device_trace_has_no_segments(tmp_path: Path, traces_dir: Path) -> None:
    ev = Events.build(op=np.array([Op.MALLOC, Op.MALLOC, Op.FREE]), size=np.array([100, 600, 100]),
                      rounded=np.array([512, 1024, 0]), addr=np.array([BASE, BASE + 4096, BASE]))
    path = tmp_path / "raw.parquet"
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), ev)
    snap = snapshot_of(path, tmp_path / "raw.pickle")
    assert snap["segments"] == [] and [e["action"] for e in snap["device_traces"][0]] == [
        "alloc", "alloc", "free_requested", "free_completed"]
    import_snapshot(tmp_path / "raw.pickle", tmp_path / "back.parquet")
    same_events(read_trace(path), read_trace(tmp_path / "back.parquet"))


def test_the_keys_are_those_of_a_real_pytorch_snapshot(tmp_path: Path, traces_dir: Path) -> None:
    """Entries, segments and blocks carry exactly the keys PyTorch 2.11 wrote on the H200."""
    from tracekit.importers.safe_pickle import load_pickle

    real = load_pickle(traces_dir / "torch-handled-oom.pickle.gz")
    ours = snapshot_of(pooled_trace(tmp_path / "p.parquet"), tmp_path / "p.pickle")

    def entry_keys(snap: dict[str, Any]) -> dict[str, set[str]]:
        return {e["action"]: set(e) for t in snap["device_traces"] for e in t if e["action"] != "snapshot"}

    assert entry_keys(ours) == entry_keys(real)
    assert {k for s in ours["segments"] for k in s} == {k for s in real["segments"] for k in s}
    assert {k for s in ours["segments"] for b in s["blocks"] for k in b} == {
        k for s in real["segments"] for b in s["blocks"] for k in b}
    assert set(ours) <= set(real)
    pool_id = type(real["segments"][0]["segment_pool_id"])
    assert all(type(s["segment_pool_id"]) is pool_id for s in ours["segments"])


def test_whole_stacks_are_the_entries_frames(tmp_path: Path) -> None:
    """A trace with whole call stacks (format v3): each entry's frames are its event's stack, innermost
    first, one list per stack; the importer reads the events back with their whole stacks (its
    call-site is the innermost frame outside PyTorch, so the site column is not compared)."""
    from tracekit.synth import Pattern, synthesize

    path = synthesize(Pattern.FRAGMENTING, 3000, 3, tmp_path / "deep.parquet", stacks=30)
    trace = read_trace(path)
    ev = trace.events
    snap = snapshot_of(path, tmp_path / "deep.pickle")
    hist = snap["device_traces"][0]
    rows = np.repeat(np.arange(len(ev)), np.where(ev.op == Op.FREE, 2, 1))
    assert len(hist) == len(rows)
    seen: dict[int, Any] = {}
    for e, r in zip(hist, rows.tolist(), strict=True):
        s = int(ev.stack[r])
        want = [{"filename": f.file, "line": max(f.line, 0), "name": f.function} for f in ev.stacks.frames(s)]
        assert e["frames"] == want
        assert seen.setdefault(s, e["frames"]) is e["frames"]
    assert max(len(f) for f in seen.values()) > 1
    for fast in (False, True):  # the restricted unpickler and the compiled scanner
        import_snapshot(tmp_path / "deep.pickle", tmp_path / f"back-{fast}.parquet", fast=fast)
        back = read_trace(tmp_path / f"back-{fast}.parquet")
        for col in ("op", "addr", "rounded", "stream", "device"):
            assert np.array_equal(getattr(ev, col), getattr(back.events, col)), col
        same_stacks(ev, back.events)  # the importer keeps whole stacks: they come back frame for frame


@pytest.mark.parametrize("first", ["python", "kernel"])
def test_chains_deeper_than_a_batch_read_back_whoever_writes_them_first(first: str) -> None:
    """A frame list is a chain of memo items; 2,500 frames span three APPENDS batches, and a list the
    Python writer defined is referred to by the kernel (and the other way round)."""
    memo = Memo()
    names = entry_names(memo)
    frames = [memo.item(("frame", f), plain_blob({"filename": f"f{f % 7}.py", "line": f, "name": "g"}))
              for f in range(2500)]
    inner = -1
    for k, f in enumerate(frames[::-1]):  # the outermost frame first: each chain extends the last
        inner = memo.chain(("stack", k), f, inner)
    half = memo.chain(("stack", "half"), frames[0], memo.keys[("stack", 1498)])
    f = io.BytesIO()
    w = Writer(f, memo)
    w.raw(b"](")  # a list of: [the chain as Python writes it?], the entries
    cols = {"kind": np.zeros(2, np.int64), "addr": np.ones(2, np.uint64), "size": np.ones(2, np.uint64),
            "stream": np.zeros(2, np.uint64), "time_us": np.zeros(2, np.int64),
            "device_free": np.zeros(2, np.int64), "frames": np.array([inner, half], np.int64)}
    if first == "python":
        w.obj(Ref(inner))
    w.raw(b"]")
    write_entries(w, cols, names)
    if first == "kernel":
        w.obj(Ref(inner))
    w.raw(b"e")
    w.end()
    data = f.getvalue()
    assert {op.name for op, _, _ in pickletools.genops(data)} <= MEMORY_VIZ_OPCODES
    got = pickle.loads(data)
    chain, entries = (got[0], got[1]) if first == "python" else (got[1], got[0])
    want = [{"filename": f"f{f % 7}.py", "line": f, "name": "g"} for f in range(2500)]
    assert chain == want and entries[0]["frames"] is chain
    assert entries[1]["frames"] == [want[0], *want[1001:]]  # frame 0, then the chain of stack 1498
    assert entries[1]["frames"][1] is chain[1001]  # frame dicts are shared, not copied
