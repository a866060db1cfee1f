"""Hostile depth in the live-bytes tree (analysis/tree): a parent chain of 100,000 stacks is
rolled up in one pass, whatever the depth."""

from __future__ import annotations

import time

import numpy as np

from tracekit.analysis.tree import TreeLimits, TreeNode, stack_tree, tree_lines
from tracekit.trace.stacks import FrameKind, StackTable

DEEP = 100_000


def chain(n: int, n_frames: int) -> StackTable:
    """Stack i = frame i mod n_frames called from stack i - 1: one chain n deep."""
    return StackTable.build([f"m{i}.py" for i in range(n_frames)], range(1, n_frames + 1), ["f"] * n_frames,
                            [int(FrameKind.USER)] * n_frames, np.arange(n) % n_frames, np.arange(n) - 1)


def path(root: TreeNode) -> list[TreeNode]:
    """The first child of each node from the root down."""
    out, n = [], root
    while n.children:
        n = n.children[0]
        out.append(n)
    return out


def test_a_hundred_thousand_deep_chain_rolls_up_fast() -> None:
    t = chain(DEEP, 3)
    stack, nbytes = np.array([DEEP - 1, DEEP // 2, 5]), np.array([1000, 100, 10])
    start = time.perf_counter()
    root = stack_tree(t, stack, nbytes, TreeLimits(min_share=0))
    took = time.perf_counter() - start
    assert took < 3, f"{took:.1f} s"  # one level at a time (before): about a minute
    assert root.bytes == 1110
    nodes = path(root)
    assert [n.bytes for n in nodes[:6]] == [1110] * 6 and nodes[6].bytes == 1100  # stack 5 holds 10
    assert len(nodes) <= TreeLimits().max_depth + 1


def recursion(depth: int, branch_at: int | None = None) -> tuple[StackTable, np.ndarray, np.ndarray]:
    """main.py:1 → rec.py:5 in f calling itself ``depth`` times → alloc.py:9 in g (8 KiB there);
    with ``branch_at``, the f at that level also calls alloc.py:9 (1 KiB)."""
    files, lines, funcs = ["main.py", "rec.py", "alloc.py"], [1, 5, 9], ["main", "f", "g"]
    frame = [0] + [1] * depth + [2]
    parent = list(range(-1, depth + 1))
    stack, nbytes = [depth + 1], [8192]
    if branch_at is not None:
        frame.append(2)
        parent.append(branch_at)
        stack.append(depth + 2)
        nbytes.append(1024)
    t = StackTable.build(files, lines, funcs, [int(FrameKind.USER)] * 3, frame, parent)
    return t, np.array(stack), np.array(nbytes)


def test_a_recursion_is_one_line_and_its_leaf_shows() -> None:
    t, stack, nbytes = recursion(1000)
    root = stack_tree(t, stack, nbytes)
    texts = [(n.text, n.repeat, n.bytes) for n in path(root)]
    assert texts == [("main.py:1 in main", 1, 8192), ("rec.py:5 in f", 1000, 8192),
                     ("alloc.py:9 in g", 1, 8192)]
    lines = tree_lines(root, "t")
    assert lines[2].endswith("rec.py:5 in f … ×1,000") and lines[3].endswith("alloc.py:9 in g")
    assert root.to_dict()["children"][0]["children"][0]["repeat"] == 1000


def test_a_run_stops_where_the_recursion_branches() -> None:
    # Level 300 of f (stack 300) calls g besides itself: f ×300 (stacks 1-300), then f ×700 under it.
    t, stack, nbytes = recursion(1000, branch_at=300)
    root = stack_tree(t, stack, nbytes, TreeLimits(min_share=0))
    f = root.children[0].children[0]
    assert (f.text, f.repeat, f.bytes) == ("rec.py:5 in f", 300, 9216)
    assert [(c.text, c.repeat, c.bytes) for c in f.children] == [("rec.py:5 in f", 700, 8192),
                                                                   ("alloc.py:9 in g", 1, 1024)]
    assert [(c.text, c.repeat) for c in f.children[0].children] == [("alloc.py:9 in g", 1)]
