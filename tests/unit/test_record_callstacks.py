"""Whole stacks in the hook, driven as CuPy drives it: the frames named, their kinds, the depth bound,
the cache, frees without stacks, and no frame kept alive."""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import types
import weakref
from pathlib import Path

import click
import numpy as np
import pytest

from tracekit.record.callstacks import (
    DEFAULT_DEPTH,
    LiveStacks,
    kind_of,
    live_stacks,
    root_kinds,
    tracekit_dirs,
)
from tracekit.record.hook import EventBuffer, TraceHook, unpack
from tracekit.record.sites import SiteTable, site_roots
from tracekit.trace import Op
from tracekit.trace.stacks import FrameKind

HERE = Path(__file__).resolve()
STREAM = types.SimpleNamespace(ptr=0x55D0_1234_5600)
BASE = 0x7F3A_0000_0000


@pytest.fixture(scope="module")
def fakelib(tmp_path_factory: pytest.TempPathFactory) -> types.ModuleType:
    """A library folder the site skips, as CuPy's is: ``zeros`` calls the hook."""
    root = tmp_path_factory.mktemp("lib")
    (root / "fakelib_stacks").mkdir()
    (root / "fakelib_stacks" / "__init__.py").write_text(
        "def zeros(hook, n, ptr):\n"
        "    hook.malloc_postprocess(device_id=0, size=n, mem_size=n, mem_ptr=ptr, pmem_id=7)\n"
        "def empty(hook, n, ptr):\n"
        "    zeros(hook, n, ptr)\n")
    sys.path.insert(0, str(root))
    try:
        import fakelib_stacks  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return fakelib_stacks


def _hook(fakelib: types.ModuleType, depth: int = DEFAULT_DEPTH) -> tuple[EventBuffer, LiveStacks, TraceHook]:
    buf = EventBuffer()
    sites = SiteTable((os.path.dirname(fakelib.__file__),), site_roots(None))
    stacks = LiveStacks(sites, depth, tracekit_dirs(), root_kinds(sites.roots))
    return buf, stacks, TraceHook(buf, sites=sites, stacks=stacks, current_stream=lambda: STREAM)


def c(hook: TraceHook, lib: types.ModuleType, ptr: int) -> None:
    lib.zeros(hook, 512, ptr)


def b(hook: TraceHook, lib: types.ModuleType, ptr: int) -> None:
    c(hook, lib, ptr)


def a(hook: TraceHook, lib: types.ModuleType, ptr: int) -> None:
    b(hook, lib, ptr)


LINE_C, LINE_B, LINE_A = (f.__code__.co_firstlineno + 1 for f in (c, b, a))


def _labels(stacks: LiveStacks, stack: int) -> list[str]:
    return [f.label() for f in stacks.table.table().frames(stack)]


def test_a_malloc_three_calls_deep_names_those_frames_innermost_first(fakelib: types.ModuleType) -> None:
    buf, stacks, hook = _hook(fakelib)
    line = sys._getframe().f_lineno + 1
    a(hook, fakelib, BASE)
    row = unpack(buf.take())
    labels = _labels(stacks, int(row["stack"][0]))
    rel = os.path.relpath(HERE, os.getcwd()) if str(HERE).startswith(os.getcwd()) else str(HERE)
    assert labels[0].endswith("fakelib_stacks/__init__.py:2:zeros")  # the library frame that asked
    assert labels[1:5] == [f"{rel}:{LINE_C}:c", f"{rel}:{LINE_B}:b", f"{rel}:{LINE_A}:a",
                           f"{rel}:{line}:test_a_malloc_three_calls_deep_names_those_frames_innermost_first"]
    # the one-frame site is as without stacks: the innermost frame outside the skipped library
    assert stacks.sites.names[int(row["site"][0])] == f"{rel}:{LINE_C}:c"
    assert not any("tracekit/record" in x for x in labels)


def test_frame_kinds_follow_the_root_a_path_lies_under(fakelib: types.ModuleType) -> None:
    buf, stacks, hook = _hook(fakelib)
    json.loads('{"x": 1}', object_hook=lambda d: a(hook, fakelib, BASE))  # through json's Python code
    click.Context(click.Command("x")).invoke(a, hook, fakelib, BASE + 4096)  # through an installed package
    rows = unpack(buf.take())
    table = stacks.table.table()
    std = [f for f in table.frames(int(rows["stack"][0])) if "json" in f.file]
    lib = [f for f in table.frames(int(rows["stack"][1])) if "click/" in f.file]
    assert std and all(f.kind is FrameKind.STDLIB for f in std)
    assert lib and all(f.kind is FrameKind.LIBRARY for f in lib)
    assert table.frames(int(rows["stack"][0]))[1].kind is FrameKind.USER  # c(), in the tests' folder


def test_kind_of_takes_the_most_specific_root() -> None:
    std = sysconfig.get_paths()["stdlib"]
    purelib = sysconfig.get_paths()["purelib"]
    kinds = root_kinds((os.getcwd(), std, purelib))
    assert kind_of(json.__file__, kinds) is FrameKind.STDLIB
    assert kind_of(np.__file__, kinds) is FrameKind.LIBRARY
    assert kind_of(os.path.join(os.getcwd(), "train.py"), kinds) is FrameKind.USER
    assert kind_of("/elsewhere/x.py", kinds) is FrameKind.USER
    assert kind_of("<frozen runpy>", kinds) is FrameKind.STDLIB
    # a package folder inside the working directory (a virtualenv there) is still a library
    nested = root_kinds((os.getcwd(), os.path.join(os.getcwd(), ".venv", "lib", "site-packages")))
    assert kind_of(os.path.join(os.getcwd(), ".venv", "lib", "site-packages", "cupy", "x.py"),
                   nested) is FrameKind.LIBRARY


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_the_depth_counts_from_the_call_site_frame(fakelib: types.ModuleType, depth: int) -> None:
    """The library's frame inside the call-site never uses up the depth: ``depth`` frames from c()."""
    buf, stacks, hook = _hook(fakelib, depth)
    a(hook, fakelib, BASE)
    row = unpack(buf.take())
    labels = _labels(stacks, int(row["stack"][0]))
    assert len(labels) == depth + 1 and labels[0].endswith(":zeros")
    here = sys._getframe().f_code.co_name
    assert [x.rsplit(":", 1)[1] for x in labels] == ["zeros", "c", "b", "a", here][:depth + 1]
    assert stacks.sites.names[int(row["site"][0])].endswith(f":{LINE_C}:c")


def d(hook: TraceHook, lib: types.ModuleType, ptr: int) -> None:
    lib.empty(hook, 512, ptr)  # two library frames deep: empty, then zeros


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_library_frames_deeper_than_the_depth_still_reach_the_users_line(fakelib: types.ModuleType,
                                                                         depth: int) -> None:
    buf, stacks, hook = _hook(fakelib, depth)
    for k in range(20):
        d(hook, fakelib, BASE + 4096 * k)
    rows = unpack(buf.take())
    assert len(set(rows["stack"].tolist())) == 1
    labels = _labels(stacks, int(rows["stack"][0]))
    names = [x.rsplit(":", 1)[1] for x in labels]
    assert names[:2] == ["zeros", "empty"] and names[2] == "d" and len(names) == 2 + depth
    # The longer window read once, then served from its cache: twice at most, since CPython 3.11 moves
    # the f_lasti of a frame calling a C function (the compiled hook) once it specialises that call
    # (tracekit.record.fastpath's docstring); 20 calls, so a cache that did not serve would hold 20.
    assert len(stacks.long) <= 2
    # LiveStacks.capture, the hook's path not inlined, answers the same
    got: list[tuple[int, int]] = []
    probe = types.SimpleNamespace(
        malloc_postprocess=lambda **kw: got.append(stacks.capture(sys._getframe(1))))
    d(probe, fakelib, BASE)  # type: ignore[arg-type]  # only malloc_postprocess is called
    (site, stack), = got
    assert site == int(rows["site"][0]) and len(_labels(stacks, stack)) == len(labels)
    assert _labels(stacks, stack)[:3] == labels[:3]  # beyond d(): this test's other line


def test_a_seen_window_is_served_from_the_cache(fakelib: types.ModuleType) -> None:
    buf, stacks, hook = _hook(fakelib)
    seen = []
    for k in range(10):
        a(hook, fakelib, BASE + 4096 * k)
        seen.append((len(stacks.hot), stacks.n_stacks))
    rows = unpack(buf.take())
    assert len(set(rows["stack"].tolist())) == 1  # one line, one stack
    # Nothing new after the first: one stack throughout, and at most one more window, the same call's
    # once CPython 3.11 specialises it (its f_lasti moves; above) whenever its warm-up ends: a cache
    # that did not serve would add a window per call.
    assert len({n_stacks for _, n_stacks in seen}) == 1
    assert seen[0][0] == 1 and seen[-1][0] <= 2 and sorted(seen) == seen


def test_frees_carry_no_stack_and_cost_what_they_did(fakelib: types.ModuleType) -> None:
    buf, _stacks, hook = _hook(fakelib)
    a(hook, fakelib, BASE)
    hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=BASE, pmem_id=7)  # type: ignore[misc]
    rows = unpack(buf.take())
    assert rows["op"].tolist() == [Op.MALLOC, Op.FREE] and rows["stack"][1] == -1 and rows["stack"][0] >= 0
    plain = TraceHook(EventBuffer(), sites=None, current_stream=lambda: STREAM)
    mine, theirs = hook.free_postprocess, plain.free_postprocess
    if hasattr(mine, "__code__"):  # the Python callbacks: one free function for every mode
        assert mine.__code__ is theirs.__code__
    else:  # the compiled ones (fastpath.Hook): the same C method, which reads no frame
        assert type(mine) is type(theirs) and mine.__name__ == theirs.__name__ == "free_postprocess"
        assert type(mine.__self__) is type(theirs.__self__)


def test_an_oom_row_carries_the_stack_of_its_request(fakelib: types.ModuleType) -> None:
    buf, _stacks, hook = _hook(fakelib)
    for ptr in (BASE, 0):  # mem_ptr 0: the pool raised out-of-memory
        a(hook, fakelib, ptr)
    rows = unpack(buf.take())
    event = rows["op"] != 15
    assert rows["op"][event].tolist() == [Op.MALLOC, Op.OOM]
    assert rows["stack"][event].tolist() == [rows["stack"][0]] * 2 and rows["stack"][0] >= 0


class _Array:
    """Something a frame's locals hold, whose end the test can see."""


def test_no_frame_is_kept_alive(fakelib: types.ModuleType) -> None:
    _buf, _stacks, hook = _hook(fakelib)

    def holder() -> weakref.ref[_Array]:
        arr = _Array()
        a(hook, fakelib, BASE)
        return weakref.ref(arr)

    ref = holder()
    assert ref() is None  # the frame that held it ended with it: the recorder kept no frame


def test_a_window_stops_at_the_launcher_frame(fakelib: types.ModuleType) -> None:
    buf = EventBuffer()
    sites = SiteTable((os.path.dirname(fakelib.__file__),), site_roots(None))
    stacks = live_stacks(sites, DEFAULT_DEPTH, launcher=sys._getframe())
    assert stacks is not None
    hook = TraceHook(buf, sites=sites, stacks=stacks, current_stream=lambda: STREAM)
    a(hook, fakelib, BASE)
    labels = _labels(stacks, int(unpack(buf.take())["stack"][0]))
    assert [x.rsplit(":", 1)[1] for x in labels] == ["zeros", "c", "b", "a"]  # this frame and beyond: out
