"""The user's own line (trace/callsite) and the live bytes by stack (analysis/tree), worked by hand."""

from __future__ import annotations

import time

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.analysis.tree import (
    NATIVE_ONLY,
    NO_STACK,
    TreeLimits,
    TreeNode,
    node_text,
    stack_tree,
    tree_lines,
)
from tracekit.trace.callsite import CallSites, FrameRoles, label_of, nearest, top_package
from tracekit.trace.stacks import FrameKind, StackTable, UserCode

VENV = "/venv/lib/python3.12/site-packages"
RUNPY = "/usr/lib/python3.12/runpy.py"
RESNET = f"{VENV}/torchvision/models/resnet.py"
CONV = f"{VENV}/torch/nn/modules/conv.py"
U, L, S, N = FrameKind.USER, FrameKind.LIBRARY, FrameKind.STDLIB, FrameKind.NATIVE


def table(frames: list[tuple[str, int, str, FrameKind]], parent: list[int]) -> StackTable:
    """Stack i = frame i called from stack parent[i]."""
    f, ln, fn, k = zip(*frames, strict=True) if frames else ((), (), (), ())
    return StackTable.build(f, ln, fn, [int(x) for x in k], range(len(frames)), parent)


# 0: runpy (outermost) <- 1: train.py:88 step <- 2: resnet.py:151 forward (innermost)
THREE = table([(RUNPY, 196, "_run_module_as_main", S), ("train.py", 88, "step", U),
               (RESNET, 151, "forward", L)], [-1, 0, 1])


def test_three_deep_stack_with_the_user_frame_in_the_middle() -> None:
    cs = CallSites.of(THREE)
    # The innermost stack: its user frame is train.py:88, the request frame the library's resnet.py:151.
    assert cs.name(int(cs.label[2])) == f"train.py:88 in step → {RESNET}:151"
    assert cs.user_site(int(cs.label[2])) == "train.py:88:step"
    assert cs.request_site(int(cs.label[2])) == f"{RESNET}:151:forward"
    # The middle stack ends at the user's frame: user and request are one frame, named as a site.
    assert cs.name(int(cs.label[1])) == "train.py:88:step"
    # The outermost (the standard library alone): no user frame; the request frame is runpy's.
    assert cs.user_site(int(cs.label[0])) is None
    assert cs.name(int(cs.label[0])) == f"{RUNPY}:196:_run_module_as_main"


def test_user_code_changes_the_answer() -> None:
    cs = CallSites.of(THREE, UserCode.of([f"{VENV}/torchvision"]))
    # resnet.py is now the user's code, and train.py is not: the innermost user frame is resnet.py.
    assert cs.name(int(cs.label[2])) == f"{RESNET}:151:forward"
    assert cs.user_site(int(cs.label[2])) == f"{RESNET}:151:forward"
    assert cs.user_site(int(cs.label[1])) is None  # train.py is outside the given PATH


def test_the_array_library_and_cpp_frames_are_not_the_request() -> None:
    # main <- step <- resnet.py:151 <- torch conv.py:549 <- c10 (C++): the request is resnet.py, the
    # innermost frame outside PyTorch and C++, as a format 1/2 trace names its one call-site.
    t = table([("train.py", 120, "main", U), ("train.py", 88, "step", U), (RESNET, 151, "forward", L),
               (CONV, 549, "_conv_forward", L), ("c10/cuda/CUDACachingAllocator.cpp", 1200, "malloc", N)],
              [-1, 0, 1, 2, 3])
    cs = CallSites.of(t)
    assert {cs.name(int(x)) for x in cs.label[2:]} == {f"train.py:88 in step → {RESNET}:151"}
    assert [f.function for f in cs.request_side(4)] == ["malloc", "_conv_forward", "forward"]


def test_tracekit_frames_never_count() -> None:
    t = table([("train.py", 5, "main", U), ("tracekit/record/hook.py", 9, "malloc", U)], [-1, 0])
    cs = CallSites.of(t)
    assert cs.name(int(cs.label[1])) == "train.py:5:main"
    assert [f.file for f in cs.frames(1)] == ["train.py"]
    assert top_package(f"{VENV}/tracekit/record/hook.py") == "tracekit" and top_package("/home/a/b.py") == ""


def test_one_frame_stacks_keep_the_site_text() -> None:
    sites = ("model.py:20:forward", "a.py:1", "weird site", f"{VENV}/torch/nn/functional.py:9:relu")
    cs = CallSites.of(StackTable.from_sites(sites))
    assert [cs.name(int(x)) for x in cs.label] == list(sites)
    assert cs.name(int(cs.of_events(np.array([-1], np.int32))[0])) is None


def test_nearest_jumps_to_the_hit_outside() -> None:
    # A chain 0 <- 1 <- ... <- 99 with hits at 10 and 50.
    parent = np.arange(-1, 99, dtype=np.int32)
    hit = np.zeros(100, bool)
    hit[[10, 50]] = True
    got = nearest(parent, hit)
    assert got[:10].tolist() == [-1] * 10
    assert set(got[10:50].tolist()) == {10} and set(got[50:].tolist()) == {50}


# main(0) <- step(1) <- resnet(2) <- c10 native(3);  main(0) <- other(4);  a native-only root (5)
TREE = table([("train.py", 120, "main", U), ("train.py", 88, "step", U), (RESNET, 151, "forward", L),
              ("alloc.cpp", 7, "malloc", N), ("train.py", 90, "other", U), ("libc.cpp", 1, "f", N)],
             [-1, 0, 1, 2, 0, -1])


def children(n: TreeNode) -> list[tuple[str, int, int]]:
    return [(c.text, c.bytes, c.blocks) for c in n.children]


def test_tree_numbers_by_hand() -> None:
    stack = np.array([3, 3, 2, 4, -1, 1, 5])
    nbytes = np.array([100, 200, 50, 600, 10, 40, 7])
    root = stack_tree(TREE, stack, nbytes, TreeLimits(min_share=0))
    assert (root.bytes, root.blocks) == (1007, 7)
    # main: 100 + 200 (C++ folded into resnet) + 50 + 600 + 40 = 990; then "other" 600, "step" 390.
    assert children(root) == [("train.py:120 in main", 990, 5), (NO_STACK, 10, 1), (NATIVE_ONLY, 7, 1)]
    main = root.children[0]
    assert main.user and children(main) == [("train.py:90 in other", 600, 1), ("train.py:88 in step", 390, 4)]
    step = main.children[1]
    assert children(step) == [(f"{RESNET}:151 in forward", 350, 3)] and not step.children[0].user
    assert step.children[0].children == ()  # the C++ frame is folded into its caller
    default = stack_tree(TREE, stack, nbytes)
    assert (default.more, default.more_bytes) == (2, 17)  # the buckets are under 1 %
    shown = stack_tree(TREE, stack, nbytes, TreeLimits(native=True, min_share=0))
    resnet = shown.children[0].children[1].children[0]
    assert children(resnet) == [("alloc.cpp:7 in malloc", 300, 2)]
    assert ("libc.cpp:1 in f", 7, 1) in children(shown)


def test_a_cut_is_counted_in_more() -> None:
    stack = np.array([3, 3, 2, 4, -1, 1, 5])
    nbytes = np.array([100, 200, 50, 600, 10, 40, 7])
    root = stack_tree(TREE, stack, nbytes, TreeLimits(min_share=0.05))
    assert (root.more, root.more_bytes) == (2, 17)  # the two buckets are under 5 %
    narrow = stack_tree(TREE, stack, nbytes, TreeLimits(max_children=1, min_share=0))
    assert [c.text for c in narrow.children] == ["train.py:120 in main"]
    assert (narrow.more, narrow.more_bytes) == (2, 17)  # the two buckets
    main = narrow.children[0]
    # One child past max_children is shown, not "… 1 more": its line costs no more.
    assert children(main) == [("train.py:90 in other", 600, 1), ("train.py:88 in step", 390, 4)]
    assert main.more == 0
    lines = tree_lines(narrow, "live")
    assert lines[0].split() == ["1007", "bytes", "100.0%", "live"]
    assert lines[1].split() == ["990", "bytes", "98.3%", "*", "train.py:120", "in", "main"]
    assert "… 2 more (17 bytes)" in lines[-1] and not any("… 1 more" in x for x in lines)


def test_identical_paths_of_two_stack_ids_are_one_node() -> None:
    # Stacks 0 and 1 are the same frame at the root (a merged table may hold both).
    t = StackTable.build(["a.py", "b.py"], [1, 2], ["f", "g"], [0, 0], [0, 0, 1, 1], [-1, -1, 0, 1])
    root = stack_tree(t, np.array([2, 3, 0]), np.array([5, 6, 1]))
    assert children(root) == [("a.py:1 in f", 12, 3)]
    assert children(root.children[0]) == [("b.py:2 in g", 11, 2)]


def test_ten_thousand_distinct_stacks_give_a_bounded_tree_fast() -> None:
    # 100 roots x 100 children: 10,100 stacks, one block each on the leaves, the bytes all different.
    n_roots, per = 100, 100
    files = [f"m{i}.py" for i in range(n_roots)] + [f"leaf{j}.py" for j in range(n_roots * per)]
    nf = len(files)
    parent = [-1] * n_roots + [i // per for i in range(n_roots * per)]
    t = StackTable.build(files, [1] * nf, ["f"] * nf, [0] * nf, range(nf), parent)
    stack = np.arange(n_roots, nf)
    nbytes = np.arange(1, n_roots * per + 1, dtype=np.int64) * 512
    start = time.perf_counter()
    root = stack_tree(t, stack, nbytes, TreeLimits(min_share=0.0, max_nodes=50, max_children=8))
    assert time.perf_counter() - start < 5
    assert root.bytes == int(nbytes.sum()) and root.count() <= 51
    shown = [c.bytes for c in root.children]
    assert shown == sorted(shown, reverse=True) and len(shown) == 8
    assert root.more == n_roots - 8 and root.more_bytes + sum(shown) == root.bytes
    assert len(tree_lines(root, "t")) <= 51 + root.count()


def test_hostile_frame_text_is_escaped_per_line() -> None:
    evil = "x\x1b]0;owned\x07.py"
    t = table([(evil, 1, "f\nFAKE  100.0%  line", U)], [-1])
    lines = tree_lines(stack_tree(t, np.array([0]), np.array([512])), "t")
    assert len(lines) == 2 and "\x1b" not in lines[1] and "\\x1b]0;owned\\x07.py" in lines[1]
    assert "\\nFAKE" in lines[1]


def test_roles_are_per_frame() -> None:
    r = FrameRoles.of(TREE, UserCode())
    assert r.native.tolist() == [False, False, False, True, False, True]
    assert r.user.tolist() == [True, True, False, False, True, False]


FILES = ("train.py", "model.py", f"{VENV}/torch/nn/f.py", f"{VENV}/tv/m.py", "tracekit/record/hook.py",
         "alloc.cpp", RUNPY)
KINDS = (U, U, L, L, U, N, S)


@st.composite
def tables(draw: st.DrawFn) -> StackTable:
    n = draw(st.integers(1, 40))
    parent = [draw(st.integers(-1, i - 1)) for i in range(n)]
    which = [draw(st.integers(0, len(FILES) - 1)) for _ in range(n)]
    return StackTable.build([FILES[w] for w in which], [i + 1 for i in range(n)], [f"f{i}" for i in range(n)],
                            [int(KINDS[w]) for w in which], range(n), parent)


def by_walking(t: StackTable, s: int) -> str | None:
    """The label of stack s, the slow way: walk its frames innermost first."""
    frames = [f for f in t.frames(s) if not f.file.startswith("tracekit/")]
    user = next((i for i, f in enumerate(frames) if f.kind is U), None)
    inner = [i for i, f in enumerate(frames) if f.kind is not N and "/torch/" not in f.file]
    req = inner[0] if inner else (0 if frames else None)
    if user is not None and req is not None and req > user:
        req = user
    u = frames[user] if user is not None else None
    r = frames[req] if req is not None else None
    return label_of(u, r)


@settings(max_examples=200, deadline=None)
@given(tables())
def test_labels_match_a_walk_of_each_stack(t: StackTable) -> None:
    cs = CallSites.of(t)
    assert [cs.name(int(x)) for x in cs.label] == [by_walking(t, s) for s in range(t.n_stacks)]


@settings(max_examples=200, deadline=None)
@given(tables(), st.data())
def test_tree_bytes_match_a_walk_of_each_block(t: StackTable, data: st.DataObject) -> None:
    stack = np.array(data.draw(st.lists(st.integers(-1, t.n_stacks - 1), max_size=30)), np.int64)
    nbytes = np.array(data.draw(st.lists(st.integers(0, 1 << 40), min_size=len(stack), max_size=len(stack))),
                      np.int64)
    everything = TreeLimits(min_share=0, max_children=1000, max_nodes=10**6, native=True)
    root = stack_tree(t, stack, nbytes, everything)
    assert root.bytes == int(nbytes.sum())
    # Every root-to-node path of the tree holds the bytes of the blocks whose shown frames start so.
    paths: dict[tuple[str, ...], int] = {}
    for s, b in zip(stack.tolist(), nbytes.tolist(), strict=True):
        shown = [f for f in reversed(t.frames(s)) if not f.file.startswith("tracekit/")] if s >= 0 else []
        texts = tuple(node_text(f) for f in shown) or ((NATIVE_ONLY,) if s >= 0 else (NO_STACK,))
        for d in range(1, len(texts) + 1):
            paths[texts[:d]] = paths.get(texts[:d], 0) + b

    def walk(n: TreeNode, path: tuple[str, ...]) -> None:
        for c in n.children:
            assert c.bytes == paths[(*path, c.text)]
            assert sum(x.bytes for x in c.children) <= c.bytes
            walk(c, (*path, c.text))

    walk(root, ())
    assert sum(c.bytes for c in root.children) == root.bytes - root.more_bytes
