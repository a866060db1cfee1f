"""The compiled hook callbacks (``tracekit.record._fastpath.Hook``) write the rows the Python ones do.

Both implementations are driven through one sequence of calls from the same lines (mallocs from user
code and through a library the site skips, frees, an out-of-memory request, a thread's trim), each
hook with its own buffer and tables, and the rows, site names and stacks compared; then the C
callbacks' own edges: positional arguments, a missing one, a custom clock, several devices."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tracekit.record import fastpath
from tracekit.record import hook as hook_mod
from tracekit.record.callstacks import LiveStacks, root_kinds, tracekit_dirs
from tracekit.record.hook import EventBuffer, TraceHook, unpack
from tracekit.record.sites import SiteTable, site_roots
from tracekit.trace import Op

pytestmark = pytest.mark.skipif(not fastpath.COMPILED, reason="the compiled helper is not built "
                                "(pip install -e . with a C compiler)")

STREAM = types.SimpleNamespace(ptr=0x55D0_1234_5600)
BASE = 0x7F3A_0000_0000


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.ModuleType]:
    """A library folder the site skips, as CuPy's is: ``zeros`` calls the hook, ``empty`` calls zeros."""
    root = tmp_path_factory.mktemp("lib")
    (root / "fakelib_chook").mkdir()
    (root / "fakelib_chook" / "__init__.py").write_text(
        "def zeros(hook, n, ptr):\n"
        "    hook.malloc_postprocess(device_id=0, size=n, mem_size=n + 512, mem_ptr=ptr, pmem_id=7)\n"
        "def empty(hook, n, ptr):\n"
        "    zeros(hook, n, ptr)\n")
    sys.path.insert(0, str(root))
    try:
        import fakelib_chook  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    yield fakelib_chook


class Clock:
    """A clock the test controls: every call one microsecond later."""

    def __init__(self) -> None:
        self.t = 1_000_000

    def __call__(self) -> int:
        self.t += 1000
        return self.t


def make(lib: types.ModuleType, mode: str, compiled: bool, monkeypatch: pytest.MonkeyPatch,
         depth: int = 64, **kw: object) -> tuple[EventBuffer, TraceHook, SiteTable, LiveStacks | None]:
    buf = EventBuffer()
    sites = SiteTable((os.path.dirname(lib.__file__),), site_roots(None))
    stacks = LiveStacks(sites, depth, tracekit_dirs(), root_kinds(sites.roots)) if mode == "stacks" else None
    with monkeypatch.context() as m:
        if not compiled:  # the pure-Python callbacks, as without the extension
            m.setattr(hook_mod, "Hook", None)
        h = TraceHook(buf, sites=None if mode == "none" else sites, stacks=stacks,
                      current_stream=lambda: STREAM, clock=kw.pop("clock", Clock()), **kw)  # type: ignore[arg-type]
    return buf, h, sites, stacks


def user_line(h: TraceHook, ptr: int) -> None:
    h.malloc_postprocess(device_id=0, size=256, mem_size=512, mem_ptr=ptr, pmem_id=1)  # type: ignore[misc]


def through_lib(h: TraceHook, lib: types.ModuleType, ptr: int) -> None:
    lib.empty(h, 1024, ptr)


def oom(h: TraceHook, lib: types.ModuleType) -> None:
    try:
        raise MemoryError("out of memory allocating 1,024 bytes")
    except MemoryError:
        lib.zeros(h, 1 << 40, 0)  # mem_ptr 0 inside the handler: the pool raised


def drive(h: TraceHook, lib: types.ModuleType) -> None:
    for k in range(40):  # enough calls for CPython to specialise every call on the way
        user_line(h, BASE + 4096 * k)
        through_lib(h, lib, BASE + 0x100000 + 4096 * k)
        h.free_postprocess(device_id=0, mem_size=512, mem_ptr=BASE + 4096 * k, pmem_id=1)  # type: ignore[misc]
    oom(h, lib)
    h.malloc_preprocess(device_id=0, size=1, mem_size=512)  # type: ignore[misc]
    h.free_preprocess(device_id=0, mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]


def stack_labels(stacks: LiveStacks | None, ids: np.ndarray) -> list[list[str]]:
    if stacks is None:
        return [[] for _ in ids]
    table = stacks.table.table()
    return [[f.label() for f in table.frames(int(s))] if s >= 0 else [] for s in ids]


@pytest.mark.parametrize("mode", ["none", "sites", "stacks"])
def test_compiled_rows_equal_the_python_rows(lib: types.ModuleType, mode: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    got = {}
    for compiled in (True, False):
        buf, h, sites, stacks = make(lib, mode, compiled, monkeypatch)
        assert (type(h.malloc_postprocess).__name__ == "builtin_function_or_method") is compiled
        drive(h, lib)
        rows = unpack(buf.take())
        names = [sites.names[s] if s >= 0 else None for s in rows["site"].tolist()]
        got[compiled] = (rows, names, stack_labels(stacks, rows["stack"]), dict(buf.notes))
    (c_rows, c_names, c_stacks, c_notes), (p_rows, p_names, p_stacks, p_notes) = got[True], got[False]
    for col in ("t", "op", "device", "pool", "addr", "size", "rounded", "stream", "device_free"):
        assert c_rows[col].tolist() == p_rows[col].tolist(), col
    assert c_names == p_names and c_stacks == p_stacks
    assert c_notes.keys() == p_notes.keys() and [n["kind"] for n in c_notes.values()] == ["oom"]
    ops = c_rows["op"].tolist()
    assert ops.count(Op.MALLOC) == 80 and ops.count(Op.FREE) == 40 and ops.count(Op.OOM) == 1
    if mode != "none":  # the site is the user's line, never the library's
        assert {n.rsplit(":", 1)[1] for n in c_names if n} == {"user_line", "through_lib", "oom"}
    if mode == "stacks":  # the library's frames are in the stack, innermost first
        libs = [s for s in c_stacks if s and s[0].endswith(":zeros")]
        assert libs and all(s[1].endswith(":empty") or s[1].endswith(":oom") for s in libs)


def test_positional_arguments_and_a_missing_one(lib: types.ModuleType,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    buf, h, _s, _st = make(lib, "stacks", True, monkeypatch)
    h.malloc_postprocess(0, 256, 512, BASE, 1)  # type: ignore[misc]
    h.malloc_postprocess(0, 256, mem_size=512, mem_ptr=BASE + 512, pmem_id=1, future=3)  # type: ignore[misc]
    h.free_postprocess(0, 512, BASE)  # type: ignore[misc]  # pmem_id is not needed
    rows = unpack(buf.take())
    assert rows["addr"].tolist() == [BASE, BASE + 512, BASE] and rows["rounded"].tolist() == [512, 512, 0]
    with pytest.raises(TypeError, match="missing argument 'mem_ptr'"):
        h.malloc_postprocess(device_id=0, size=1, mem_size=512)  # type: ignore[misc]
    with pytest.raises(TypeError, match="at most 4 arguments"):
        h.free_postprocess(0, 512, BASE, 1, 2)  # type: ignore[misc]
    with pytest.raises(TypeError):
        h.free_postprocess(device_id="0", mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]
    with pytest.raises(OverflowError):
        h.malloc_postprocess(device_id=1 << 70, size=1, mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]
    assert buf.take().shape == (0, 8)  # nothing written by a call that raised


def test_the_native_clock_is_perf_counter_ns(lib: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    buf, h, _s, _st = make(lib, "none", True, monkeypatch, clock=time.perf_counter_ns)
    before = time.perf_counter_ns()
    user_line(h, BASE)
    after = time.perf_counter_ns()
    (t,) = unpack(buf.take())["t"].tolist()
    assert before <= t <= after


def test_several_devices_write_the_current_device(lib: types.ModuleType,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    for compiled in (True, False):
        buf, h, _s, _st = make(lib, "sites", compiled, monkeypatch, current_device=lambda: 3)
        user_line(h, BASE)  # CuPy says device 0; the current one is 3
        h.free_postprocess(device_id=1, mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]
        assert unpack(buf.take())["device"].tolist() == [3, 1] and h.mismatches == [0]


def test_the_hook_trims_when_due(lib: types.ModuleType, monkeypatch: pytest.MonkeyPatch,
                                 tmp_path: Path) -> None:
    buf, h, _s, _st = make(lib, "sites", True, monkeypatch)
    written: list[int] = []

    def drain() -> None:
        written.append(len(buf.rows))
        buf.written = len(buf.rows)

    buf.attach(cap=8 * 5, interval_ns=10**15, drain=drain)
    for k in range(12):
        user_line(h, BASE + 512 * k)
    assert written == [40, 40] and len(buf.rows) == 16  # trimmed at 5 rows held, twice
    buf.due = 0  # the interval passed: the next row trims
    h.free_postprocess(device_id=0, mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]
    assert written[-1] == 24 and len(buf.rows) == 0


def _capsule(name: bytes) -> object:
    """A capsule of libc's ``getpagesize`` (a C function of no argument returning the page size, no
    system call) under ``name``, made as Cython makes those of ``__pyx_capi__``."""
    import ctypes

    libc = ctypes.CDLL(None)
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    text = ctypes.create_string_buffer(name)
    capsule = new(ctypes.cast(libc.getpagesize, ctypes.c_void_p).value, text, None)
    _capsule.keep.append(text)  # type: ignore[attr-defined]  # the capsule points at its name
    return capsule


_capsule.keep = []  # type: ignore[attr-defined]


def test_the_stream_comes_from_cupys_c_function_where_given(lib: types.ModuleType,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``stream_ptr``: a capsule named as CuPy's ``get_current_stream_ptr`` (Cython adds its exception
    clause) is called in C instead of ``stream().ptr``, for mallocs and frees; a capsule of another
    signature is refused; ``stream_capsule`` finds CuPy's where its ``__pyx_capi__`` has one."""
    import mmap

    buf, h, _s, _st = make(lib, "none", True, monkeypatch,
                           stream_ptr=_capsule(b"intptr_t (void) except? -1"))
    user_line(h, BASE)
    h.free_postprocess(device_id=0, mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]
    assert unpack(buf.take())["stream"].tolist() == [mmap.PAGESIZE] * 2  # not STREAM.ptr
    with pytest.raises(TypeError, match="int \\(void\\)"):
        make(lib, "none", True, monkeypatch, stream_ptr=_capsule(b"int (void)"))
    with pytest.raises(TypeError):
        make(lib, "none", True, monkeypatch, stream_ptr=object())
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(stream=types.SimpleNamespace(
        __pyx_capi__={"get_current_stream_ptr": "capsule"})))
    monkeypatch.delitem(sys.modules, "cupy_backends.cuda.stream", raising=False)
    assert hook_mod.stream_capsule(fake) == "capsule"
    assert hook_mod.stream_capsule(types.SimpleNamespace(cuda=types.SimpleNamespace())) is None
    backends = types.SimpleNamespace(__pyx_capi__={"get_current_stream_ptr": "backends' capsule"})
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.stream", backends)  # loaded by CuPy: one lookup less
    assert hook_mod.stream_capsule(fake) == "backends' capsule"


def many_lines(n: int, where: Path) -> types.FunctionType:
    """A function (in a file of the user's) whose ``n`` lines each make one malloc: ``n`` distinct
    windows from one frame."""
    body = "".join(f"    h.malloc_postprocess(device_id=0, size={k + 1}, mem_size=512,"
                   f" mem_ptr=base + {k} * 512, pmem_id=1)\n" for k in range(n))
    path = where / f"many_lines_{n}.py"
    path.write_text(f"def lines(h, base):\n{body}")
    ns: dict[str, object] = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns["lines"]  # type: ignore[return-value]


@pytest.mark.parametrize("n", [300, 3000])  # a few hundred windows, then more than the C table holds
def test_many_windows_hit_again_keep_their_own_answers(lib: types.ModuleType, n: int, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows seen again are answered from the compiled hook's own table: each keeps its own site and
    stack, however many windows share its slots or push each other out."""
    lines = many_lines(n, tmp_path)
    got = {}
    for compiled in (True, False):
        buf, h, sites, stacks = make(lib, "stacks", compiled, monkeypatch)
        for round_ in range(3):
            lines(h, BASE + round_ * n * 512)
        rows = unpack(buf.take())
        got[compiled] = ([sites.names[s] for s in rows["site"].tolist()], stack_labels(stacks, rows["stack"]))
    assert got[True] == got[False]
    names, labels = got[True]
    assert len(set(names[:n])) == n and names[:n] == names[n:2 * n] == names[2 * n:]
    assert labels[:n] == labels[n:2 * n] == labels[2 * n:]
