"""Whole stacks from PyTorch snapshots: worked stacks, both readers alike, hostile frames, real snapshots."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.importers.pickle_kernel import MAX_DEPTH
from tracekit.importers.torch_columns import is_torch_file
from tracekit.importers.torch_snapshot import import_snapshot, scan_file
from tracekit.importers.torch_stacks import StackBuilder, first_use, frame_kind
from tracekit.trace import read_trace
from tracekit.trace.stacks import MAX_LINE, FrameKind

TRACES = Path(__file__).resolve().parents[2] / "traces"
A = 0x7F00_0000_0000
MiB = 1 << 20
CPP = {"filename": "/pytorch/c10/cuda/CUDACachingAllocator.cpp", "line": 1200, "name": "malloc"}
LIB = {"filename": "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py", "line": 125,
       "name": "forward"}
STD = {"filename": "/usr/lib/python3.12/contextlib.py", "line": 81, "name": "inner"}
LAYER = {"filename": "/home/u/model.py", "line": 30, "name": "layer"}
STEP = {"filename": "/home/u/train.py", "line": 88, "name": "step"}
MAIN = {"filename": "/home/u/train.py", "line": 120, "name": "<module>"}


def entry(action: str, addr: int, size: int, t: int, frames: list[Any]) -> dict[str, Any]:
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t, "frames": frames}


def both(tmp: Path, snap: Any, **kw: Any) -> Any:
    """The trace each reader gives (the compiled scanner, the unpickler), checked to be the same."""
    p = tmp / "s.pickle"
    p.write_bytes(pickle.dumps(snap, protocol=4))
    assert scan_file(p) is not None  # the compiled scanner reads it (no fallback), stacks and all
    got = []
    for fast in (True, False):
        r = import_snapshot(p, tmp / f"o{fast}.parquet", fast=fast, force=True, **kw)
        got.append(read_trace(r.path).events)
    a, b = got
    assert np.array_equal(a.stack, b.stack)
    assert a.stacks.to_json() == b.stacks.to_json()
    return a


def labels(ev: Any, i: int) -> list[str]:
    return [f.label() for f in ev.stacks.frames(int(ev.stack[i]))]


def worked() -> dict[str, Any]:
    # Two requests from one layer called from one step; a third from the step itself; C++ innermost.
    hist = [entry("segment_alloc", A, 2 * MiB, 0, [CPP, MAIN]),
            entry("alloc", A, 512, 1, [CPP, LIB, LAYER, STEP, MAIN]),
            entry("alloc", A + 512, 512, 2, [CPP, LIB, LAYER, STEP, MAIN]),
            entry("alloc", A + 1024, 512, 3, [CPP, STD, STEP, MAIN]),
            entry("free_completed", A, 512, 4, [])]
    return {"segments": [], "device_traces": [hist]}


def test_worked_stacks_python_frames(tmp_path: Path) -> None:
    ev = both(tmp_path, worked())
    # rows: segment_alloc, malloc, malloc, malloc, free
    assert labels(ev, 0) == ["/home/u/train.py:120:<module>"]
    assert labels(ev, 1) == [f"{LIB['filename']}:125:forward", "/home/u/model.py:30:layer",
                             "/home/u/train.py:88:step", "/home/u/train.py:120:<module>"]
    assert ev.stack[1] == ev.stack[2]  # the same path, one stack id
    assert labels(ev, 3) == [f"{STD['filename']}:81:inner", "/home/u/train.py:88:step",
                             "/home/u/train.py:120:<module>"]
    assert ev.stack[4] == -1
    t = ev.stacks
    # Frames once each: <module>, step, layer, forward, inner; the outer stacks shared:
    # <module>; step<-<module>; layer<-step; forward<-layer; inner<-step.
    assert t.n_frames == 5 and t.n_stacks == 5
    kinds = {t.file[f]: FrameKind(int(t.kind[f])) for f in range(t.n_frames)}
    assert kinds[LIB["filename"]] is FrameKind.LIBRARY and kinds[STD["filename"]] is FrameKind.STDLIB
    assert kinds["/home/u/train.py"] is FrameKind.USER
    # the site stays the innermost frame outside PyTorch
    assert ev.sites[ev.site[1]] == "/home/u/model.py:30:layer"


def test_worked_stacks_with_cpp_frames(tmp_path: Path) -> None:
    ev = both(tmp_path, worked(), stacks=True)
    f = ev.stacks.frames(int(ev.stack[1]))
    assert f[0].kind is FrameKind.NATIVE and f[0].label() == f"{CPP['filename']}:1200:malloc"
    assert [x.label() for x in f[1:]] == labels(both(tmp_path, worked()), 1)
    # the C++ frame is interned once under its three different Python callers
    assert ev.stacks.n_frames == 6 and ev.stacks.n_stacks == 5 + 3


def test_initial_state_blocks_keep_their_stacks(tmp_path: Path) -> None:
    # The history starts mid-run: the live block never appears in it, so it comes from the segments.
    blocks = [{"address": A, "size": 512, "requested_size": 500, "state": "active_allocated",
               "frames": [LIB, LAYER, STEP]}]
    seg = {"device": 0, "address": A, "total_size": 2 * MiB, "stream": 0, "frames": [MAIN], "blocks": blocks}
    ev = both(tmp_path, {"segments": [seg], "device_traces": [[entry("alloc", A + 512, 512, 1, [STEP])]]})
    # initial rows: segment_alloc (its frames), malloc of the block; then the history's malloc
    assert labels(ev, 0) == ["/home/u/train.py:120:<module>"]
    assert labels(ev, 1)[1:] == ["/home/u/model.py:30:layer", "/home/u/train.py:88:step"]
    assert labels(ev, 2) == ["/home/u/train.py:88:step"]


def test_hostile_frames_are_kept_safely(tmp_path: Path) -> None:
    odd = [{"filename": 7, "line": "x", "name": None},
           {"filename": "/h/a.py", "line": 2**64 - 1, "name": "f"},
           {"filename": "/h/b.py", "line": -5, "name": "g" * 100_000}, "not a frame", STEP]
    hist = [entry("alloc", A, 512, 1, odd)]
    p = tmp_path / "s.pickle"
    p.write_bytes(pickle.dumps({"segments": [], "device_traces": [hist]}, protocol=4))
    assert scan_file(p) is None  # a list mixing frames and other values goes to the unpickler
    ev = read_trace(import_snapshot(p, tmp_path / "o.parquet", stacks=True).path).events
    f = ev.stacks.frames(int(ev.stack[0]))
    assert (f[0].file, f[0].line, f[0].function, f[0].kind) == ("?", -1, "?", FrameKind.NATIVE)  # no file
    assert (f[1].file, f[1].line) == ("/h/a.py", -1)  # beyond int32: unknown, not wrapped
    assert f[2].line == -1 and len(f[2].function) <= 4096
    assert f[3].label() == "/home/u/train.py:88:step" and len(f) == 4


def test_huge_lines_both_readers(tmp_path: Path) -> None:
    big = {"filename": "/h/a.py", "line": 2**64 - 1, "name": "f"}
    ev = both(tmp_path, {"segments": [], "device_traces": [[entry("alloc", A, 512, 1, [big, STEP])]]})
    assert [x.line for x in ev.stacks.frames(int(ev.stack[0]))] == [-1, 88]
    assert ev.sites[ev.site[0]] == f"/h/a.py:{2**64 - 1}:f"  # the site keeps the number as written


def test_deep_recursion_keeps_the_innermost_frames(tmp_path: Path) -> None:
    deep = [{"filename": "/h/rec.py", "line": i, "name": "rec"} for i in range(MAX_DEPTH + 500)]
    ev = both(tmp_path, {"segments": [], "device_traces": [[entry("alloc", A, 512, 1, deep),
                                                            entry("alloc", A + 512, 512, 2, deep[:3])]]})
    f = ev.stacks.frames(int(ev.stack[0]))
    assert len(f) == MAX_DEPTH and [x.line for x in f[:3]] == [0, 1, 2] and f[-1].line == MAX_DEPTH - 1
    assert [x.line for x in ev.stacks.frames(int(ev.stack[1]))] == [0, 1, 2]


def test_frame_kinds() -> None:
    assert frame_kind("") is frame_kind("??") is frame_kind("/lib/libtorch_cuda.so") is FrameKind.NATIVE
    assert frame_kind("torch/nn/functional.py") is FrameKind.LIBRARY
    assert frame_kind("/venv/lib/python3.12/site-packages/transformers/x.py") is FrameKind.LIBRARY
    assert frame_kind("/usr/lib/python3.12/threading.py") is FrameKind.STDLIB
    assert frame_kind("<frozen runpy>") is FrameKind.STDLIB
    assert frame_kind("/home/u/train.py") is frame_kind("<stdin>") is FrameKind.USER


def test_builder_interns_by_content_not_identity() -> None:
    b = StackBuilder()
    k1 = b.of_frames([dict(STEP), dict(MAIN)])
    k2 = b.of_frames([dict(STEP), dict(MAIN)])  # equal frames in other dicts
    assert k1 == k2 and len(b.frames) == 2
    stack, table = b.table(np.array([-1, k1, k2], np.int32))
    assert stack.tolist() == [-1, 1, 1] and table.n_stacks == 2 and table.parent.tolist() == [-1, 0]


@pytest.mark.parametrize("path", sorted(TRACES.glob("torch-*.pickle.gz")), ids=lambda p: p.name)
def test_real_snapshots_stacks_hold_the_sites(path: Path, tmp_path: Path) -> None:
    """The innermost frame outside PyTorch of each row's stack is today's site (a line beyond
    int32, as PyTorch writes for some frames, is unknown in the stack)."""
    ev = read_trace(import_snapshot(path, tmp_path / "o.parquet", fast=True).path).events
    has = np.flatnonzero(ev.site >= 0)
    assert len(has) and bool(np.all(ev.stack[has] >= 0))
    pairs = np.unique(np.stack([ev.stack[has], ev.site[has]]), axis=1)
    for s, site in pairs.T.tolist():
        frames = ev.stacks.frames(s)
        inner = next((f for f in frames if not is_torch_file(f.file)), frames[0])
        file, line, fn = ev.sites[site].rsplit(":", 2)
        assert (inner.file, inner.function) == (file, fn)
        assert inner.line == (int(line) if int(line) <= MAX_LINE else -1)


@given(st.lists(st.integers(-1, 9), max_size=200), st.integers(1, 17))
@settings(max_examples=200, deadline=None)
def test_first_use_is_the_order_keys_first_occur(keys: list[int], chunk: int) -> None:
    want = list(dict.fromkeys(k for k in keys if k >= 0))
    assert first_use(np.array(keys, np.int32), 10, chunk).tolist() == want
