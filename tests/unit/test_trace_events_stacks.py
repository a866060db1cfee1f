"""Events.stack / Events.stacks in memory: defaults, take, concat (tables merged, ids remapped),
pickling, build's checks; and the table merge itself, with worked answers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tracekit.trace import Events, Op
from tracekit.trace.stacks import StackInterner, StackTable, from_json, merge

# a: frames 0 main.py:1 main, 1 lib.py:7 alloc; stacks 0 = main, 1 = alloc <- main
A = StackTable.build(["main.py", "lib.py"], [1, 7], ["main", "alloc"], [0, 1], [0, 1], [-1, 0])
# b: frames 0 lib.py:7 alloc, 1 main.py:1 main, 2 other.py:3 g; stacks 0 = main, 1 = g <- main,
#    2 = alloc <- g <- main, 3 = alloc <- main (the same path as A's stack 1)
B = StackTable.build(["lib.py", "main.py", "other.py"], [7, 1, 3], ["alloc", "main", "g"], [1, 0, 0],
                     [1, 2, 0, 0], [-1, 0, 1, 0])


def ev(stack: list[int], table: StackTable | None, sites: tuple[str, ...] = ()) -> Events:
    n = len(stack)
    return Events.build(np.zeros(n, np.int8), np.full(n, 512, np.uint64),
                        addr=np.arange(n, dtype=np.uint64) * 4096, sites=sites,
                        site=np.array([0 if sites else -1] * n, np.int32),
                        stack=None if table is None else np.array(stack, np.int32), stacks=table)


def labels(e: Events, i: int) -> list[str]:
    return [f.label() for f in e.stacks.frames(int(e.stack[i]))]


def test_without_stacks_the_sites_are_one_frame_stacks() -> None:
    e = Events.build(np.array([Op.MALLOC, Op.FREE], np.int8), np.array([8, 8], np.uint64),
                     site=np.array([1, -1], np.int32), sites=("a.py:3:f", "lib/site-packages/x.py:9:g"))
    assert e.stack.tolist() == [1, -1] and e.stack.flags.writeable is False
    (frame,) = e.stacks.frames(1)
    assert frame.label() == "lib/site-packages/x.py:9:g" and frame.kind.name == "LIBRARY"
    assert e.stacks.frames(-1) == []


def test_a_table_without_ids_means_no_event_has_a_stack() -> None:
    e = Events.build(np.zeros(3, np.int8), np.ones(3, np.uint64), stacks=A)
    assert e.stack.tolist() == [-1, -1, -1] and e.stacks is A


def test_build_refuses_ids_without_a_table_and_ids_out_of_range() -> None:
    with pytest.raises(ValueError, match="without the StackTable"):
        Events.build(np.zeros(1, np.int8), np.ones(1, np.uint64), stack=np.array([0]))
    with pytest.raises(ValueError, match=r"ids outside -1 .. 1"):
        ev([0, 2], A)
    with pytest.raises(ValueError, match=r"ids outside -1 .. 1"):
        ev([-2], A)


def test_take_keeps_the_table_and_the_ids() -> None:
    e = ev([1, 0, -1, 1], A).take(np.array([True, False, False, True]))
    assert e.stack.tolist() == [1, 1] and e.stacks is A
    assert labels(e, 0) == ["lib.py:7:alloc", "main.py:1:main"]


def test_concat_merges_the_tables_and_remaps_every_id() -> None:
    c = Events.concat([ev([1, 0, -1], A), ev([2, 3, 1, -1], B)])
    # A's stacks keep their ids (0 main, 1 alloc<-main); B's 0 main -> 0, 1 g<-main -> 2,
    # 2 alloc<-g<-main -> 3, 3 alloc<-main -> 1 (the same path as A's 1)
    assert c.stack.tolist() == [1, 0, -1, 3, 1, 2, -1]
    assert c.stacks.n_stacks == 4 and c.stacks.n_frames == 3
    assert labels(c, 3) == ["lib.py:7:alloc", "other.py:3:g", "main.py:1:main"]
    assert labels(c, 4) == labels(c, 0) == ["lib.py:7:alloc", "main.py:1:main"]


def test_concat_of_batches_of_one_table_remaps_nothing() -> None:
    e = ev([1, 0, 1], A)
    c = Events.concat([e.take(slice(0, 1)), e.take(slice(1, 3))])
    assert c.stacks is A and c.stack.tolist() == [1, 0, 1]


def test_concat_mixes_recorded_stacks_and_one_frame_sites() -> None:
    c = Events.concat([ev([1], A), ev([0], None, sites=("b.py:2:h",))])
    assert labels(c, 0) == ["lib.py:7:alloc", "main.py:1:main"] and labels(c, 1) == ["b.py:2:h"]


def test_pickling_keeps_stacks_and_read_only_columns() -> None:
    e = pickle.loads(pickle.dumps(ev([1, -1, 0], A)))
    assert e.stack.tolist() == [1, -1, 0] and e.stack.flags.writeable is False
    assert e.stacks.to_json() == A.to_json()


def test_merge_is_an_interner_over_every_table() -> None:
    table, (la, lb) = merge([A, B])
    assert la.tolist() == [0, 1, -1] and lb.tolist() == [0, 2, 3, 1, -1]
    assert table.to_json() == {
        "frames": {"file": ["main.py", "lib.py", "other.py"], "line": [1, 7, 3],
                   "function": ["main", "alloc", "g"], "kind": [0, 1, 0]},
        "stacks": {"frame": [0, 1, 2, 1], "parent": [-1, 0, 0, 2]},
    }


def test_interner_gives_equal_frames_and_paths_one_id() -> None:
    t = StackInterner()
    f, g = t.frame_id("a.py", 1, "f", 0), t.frame_id("b.py", 2, "g", 0)
    assert t.frame_id("a.py", 1, "f", 0) == f and t.frame_id("a.py", 1, "f", 1) not in (f, g)
    s = t.stack_id(g, t.stack_id(f, -1))
    assert t.stack_id(g, t.stack_id(f, -1)) == s and t.table().depth(s) == 2


def test_from_json_round_trips_to_json() -> None:
    assert from_json(B.to_json()).to_json() == B.to_json()
