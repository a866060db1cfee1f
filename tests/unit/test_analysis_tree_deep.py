"""Hostile depth in the live-bytes tree (analysis/tree): a parent chain of 100,000 stacks is
rolled up in one pass, whatever the depth."""

from __future__ import annotations

import time

import numpy as np

from tracekit.analysis.tree import TreeLimits, TreeNode, stack_tree
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
