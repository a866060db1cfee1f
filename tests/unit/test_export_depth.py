"""Exports bound each stack's frames by ``MAX_FRAMES``: a deep parent chain costs the bound, not its depth.

A trace's stack table may chain millions of frames (deep recursion or a hostile file); each export
format lists a stack's frames in full, so both write the innermost ``MAX_FRAMES`` and count the rest.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.export.depth import MAX_FRAMES, Cut, cut_of, needed
from tracekit.export.run import Format, export_file
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.stacks import FrameKind, StackTable

DEPTH = 100_000
N_FRAMES = 7  # frame of stack s: s % N_FRAMES


def chain(n: int) -> StackTable:
    """Stack s = frame s % N_FRAMES called from stack s - 1: one chain n frames deep."""
    return StackTable.build([f"r{i}.py" for i in range(N_FRAMES)], list(range(1, N_FRAMES + 1)),
                            [f"f{i}" for i in range(N_FRAMES)], [FrameKind.USER] * N_FRAMES,
                            np.arange(n) % N_FRAMES, np.arange(n) - 1)


def deep_trace(path: Path, n: int, stacks: list[int]) -> Path:
    """A segment, then a malloc naming each of ``stacks`` (the last one freed)."""
    k = len(stacks)
    op = np.array([Op.SEGMENT_ALLOC, *[Op.MALLOC] * k, Op.FREE], np.int8)
    addr = np.array([0x10000, *(0x10000 + 512 * i for i in range(k)), 0x10000 + 512 * (k - 1)], np.uint64)
    size = np.array([2 << 20, *[512] * k, 512], np.uint64)
    ev = Events.build(op, size, addr=addr, rounded=size, stack=np.array([-1, *stacks, stacks[-1]], np.int32),
                      stacks=chain(n))
    return write_trace(path, TraceMeta.new(Source.SYNTHETIC), ev)


def innermost(table: StackTable, s: int, k: int) -> list[tuple[str, int, str]]:
    out = []
    for f in table.walk(s):
        if len(out) == k:
            break
        fr = table.frame_at(f)
        out.append((fr.file, fr.line, fr.function))
    return out


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return deep_trace(tmp_path_factory.mktemp("deep") / "deep.parquet", DEPTH, [DEPTH - 1, DEPTH // 2, 10])


def test_a_deep_snapshot_holds_the_innermost_frames_and_says_what_it_left_out(deep: Path,
                                                                              tmp_path: Path) -> None:
    res = export_file(deep, Format.TORCH_SNAPSHOT, tmp_path / "d.pickle")
    left = (DEPTH - MAX_FRAMES) + (DEPTH // 2 + 1 - MAX_FRAMES)  # stacks DEPTH-1 and DEPTH/2; 10 fits
    assert res.cut == Cut(MAX_FRAMES, 2, left)
    # bounded by the input: a few frame dicts and 3 lists of ≤ MAX_FRAMES references (≤ 5 bytes each)
    assert res.path.stat().st_size < 3 * 5 * MAX_FRAMES + 4096
    snap = pickle.loads(res.path.read_bytes())
    table = chain(DEPTH)
    got = [[(d["filename"], d["line"], d["name"]) for d in e["frames"]]
           for e in snap["device_traces"][0] if e["action"] == "alloc"]
    assert got == [innermost(table, s, MAX_FRAMES) for s in (DEPTH - 1, DEPTH // 2, 10)]
    assert [len(g) for g in got] == [MAX_FRAMES, MAX_FRAMES, 11]
    blocks = [b for b in snap["segments"][0]["blocks"] if b["state"] == "active_allocated"]
    assert [len(b["frames"]) for b in blocks] == [MAX_FRAMES, MAX_FRAMES]  # stack 10's block was freed


def test_a_deep_speedscope_cuts_the_same_stacks_root_last_kept(deep: Path, tmp_path: Path) -> None:
    res = export_file(deep, Format.SPEEDSCOPE, tmp_path / "d.json")
    assert res.cut == Cut(MAX_FRAMES, 2, (DEPTH - MAX_FRAMES) + (DEPTH // 2 + 1 - MAX_FRAMES))
    doc = json.loads(res.path.read_text())
    assert len(doc["shared"]["frames"]) <= N_FRAMES
    assert res.path.stat().st_size < 5 * 3 * 7 * MAX_FRAMES + 8192  # each sample ≤ MAX_FRAMES indices
    allocated = doc["profiles"][-1]
    names = [f["name"] for f in doc["shared"]["frames"]]
    table = chain(DEPTH)
    want = {tuple(reversed([f"{fn} ({file}:{line})" for file, line, fn in innermost(table, s, MAX_FRAMES)]))
            for s in (DEPTH - 1, DEPTH // 2, 10)}  # a frame is named function (file:line)
    assert {tuple(names[i] for i in s) for s in allocated["samples"]} == want


def test_a_shallow_trace_is_not_cut(tmp_path: Path) -> None:
    path = deep_trace(tmp_path / "s.parquet", MAX_FRAMES, [MAX_FRAMES - 1, 3])
    for fmt in Format:
        assert export_file(path, fmt, tmp_path / f"s.{fmt.value}").cut == Cut(MAX_FRAMES, 0, 0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1, 40), min_size=1, max_size=60), st.lists(st.integers(0, 59), max_size=8),
       st.integers(1, 6))
def test_needed_is_every_stack_within_the_limit_of_a_used_one(links: list[int], used: list[int],
                                                              limit: int) -> None:
    parent = [min(p, s - 1) for s, p in enumerate(links)]  # every parent earlier, as the table requires
    n = len(parent)
    table = StackTable.build(["a.py"], [1], ["f"], [0], [0] * n, parent)
    starts = np.unique([u % n for u in used]).astype(np.int64)
    want: set[int] = set()
    for s in starts.tolist():
        cur, k = s, 0
        while cur >= 0 and k < limit:
            want.add(cur)
            cur, k = parent[cur], k + 1
    assert set(needed(table, starts, limit).tolist()) == want
    depth = [table.depth(s) for s in starts.tolist()]
    assert cut_of(table, starts, limit) == Cut(limit, sum(d > limit for d in depth),
                                               sum(d - limit for d in depth if d > limit))


def test_entries_written_in_small_pieces_are_the_same_snapshot(deep: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiled writer's buffer is bounded by splitting a chunk where its worst case passes
    # PIECE_BYTES; a split anywhere (here: after every entry) only restarts an APPENDS batch.
    from tracekit.export import pickle_writer

    whole = export_file(deep, Format.TORCH_SNAPSHOT, tmp_path / "whole.pickle").path.read_bytes()
    monkeypatch.setattr(pickle_writer, "PIECE_BYTES", 1)
    split = export_file(deep, Format.TORCH_SNAPSHOT, tmp_path / "split.pickle").path.read_bytes()
    assert split != whole and pickle.loads(split) == pickle.loads(whole)
