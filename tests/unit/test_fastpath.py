"""tracekit.record.fastpath, both implementations: the C extension (skipped, saying why, where it
was not built) and the pure-Python fallback. The window hash: equal windows hash equal, different
call paths (caller line, caller function, recursion depth, stop frame, depth cut, skip) differ, the
frames are the ones ``sys._getframe`` and ``f_back`` give, and no frame or code object is leaked.
The ring: rows read back in seq order (wrap-around too) from the same buffer and from another
process mapping the same file, slots being written never returned, also against a live writer."""

from __future__ import annotations

import gc
import json
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import types
import weakref
from pathlib import Path

import numpy as np
import pytest

from tracekit.record import fastpath
from tracekit.record.fastpath import MAGIC, read_ring, ring_bytes, ring_header

try:
    from tracekit.record import _fastpath
except ImportError as e:  # not built: the fallback's tests still run
    _fastpath = None  # type: ignore[assignment]
    _WHY = f"the C extension tracekit.record._fastpath is not built ({e}): setup.py build_ext --inplace"
else:
    _WHY = ""

ROOT = Path(__file__).resolve().parents[2]

PURE = types.SimpleNamespace(name="pure", window_hash=fastpath.py_window_hash,
                             window_frames=fastpath.py_window_frames, Ring=fastpath.PyRing)
COMPILED = types.SimpleNamespace(name="compiled", window_hash=getattr(_fastpath, "window_hash", None),
                                 window_frames=getattr(_fastpath, "window_frames", None),
                                 Ring=getattr(_fastpath, "Ring", None))


@pytest.fixture(params=["compiled", "pure"])
def api(request: pytest.FixtureRequest) -> types.SimpleNamespace:
    if request.param == "compiled":
        if _fastpath is None:
            pytest.skip(_WHY)
        return COMPILED
    return PURE


# -- call paths ------------------------------------------------------------------------------------
# Each helper calls the implementation at one instruction, so a window differs only by its callers.

def leaf(api, skip=0, depth=64, stop=None):  # type: ignore[no-untyped-def]
    return api.window_hash(skip, depth, stop)


def leaf_twin(api, skip=0, depth=64, stop=None):  # type: ignore[no-untyped-def]
    return api.window_hash(skip, depth, stop)


def via_a(api, **kw):  # type: ignore[no-untyped-def]
    return leaf(api, **kw)


def via_b(api, **kw):  # type: ignore[no-untyped-def]
    return leaf(api, **kw)


def rec(api, n, **kw):  # type: ignore[no-untyped-def]
    return leaf(api, **kw) if n == 0 else rec(api, n - 1, **kw)


def frames_and_walk(api, skip, depth, stop):  # type: ignore[no-untyped-def]
    """(window_frames from here, the same window walked by hand from here)."""
    got = api.window_frames(skip, depth, stop)
    try:
        f: types.FrameType | None = sys._getframe(skip)
    except ValueError:
        f = None
    want: list[types.FrameType] = []
    while f is not None and f is not stop and len(want) < depth:
        want.append(f)
        f = f.f_back
    return got, want


# -- the window hash ---------------------------------------------------------------------------


def settled(fn, *args, **kw):  # type: ignore[no-untyped-def]
    """``fn(*args, **kw)`` once CPython has specialised the calls on its path, checked to be steady.

    CPython 3.11 moves a frame's ``f_lasti`` while it calls a C function once that call is
    specialised (the call runs in PRECALL, not CALL): a window's hash may change once in its
    first few hundred calls (a second cache entry for the same stack, never a wrong one). Every
    comparison below is between settled hashes."""
    out = []
    for _ in range(300):  # a loop, not a comprehension: the same frames on 3.11 (its own frame) and 3.12
        out.append(fn(*args, **kw))
    assert len(set(out[100:])) == 1, "the same window gave different hashes"
    return out[-1]


def test_equal_windows_hash_equal(api: types.SimpleNamespace) -> None:
    settled(leaf, api)
    settled(rec, api, 3)
    settled(leaf, api, depth=2, stop=sys._getframe())
    hashes = set()
    for _ in range(5):
        hashes.add(leaf(api))  # one instruction, settled above: the same window every time
    assert len(hashes) == 1


def test_caller_line_changes_the_hash(api: types.SimpleNamespace) -> None:
    first = settled(leaf, api)
    second = settled(leaf, api)
    assert first != second


def test_caller_function_changes_the_hash(api: types.SimpleNamespace) -> None:
    a, b = (settled(f, api) for f in (via_a, via_b))  # called from one instruction
    assert a != b


def test_recursion_depth_changes_the_hash(api: types.SimpleNamespace) -> None:
    hashes = [settled(rec, api, n) for n in range(6)]
    assert len(set(hashes)) == 6


def test_stop_frame_ends_the_window(api: types.SimpleNamespace) -> None:
    here = sys._getframe()
    # Stopping at this frame leaves settled's and leaf's frames: a window of depth 2 at the same
    # instructions; without the stop the window goes on into pytest's frames.
    open_ended = settled(leaf, api)
    stopped = settled(leaf, api, stop=here)
    two = settled(leaf, api, depth=2)
    assert stopped == two
    assert open_ended != stopped
    results = [settled(f, api, stop=here) for f in (via_a, via_b)]
    assert results[0] != results[1]  # the frames inside the stop still differ
    # a stop that is no frame matches none, as an identity test would not (same call site for both)
    plain, not_a_frame = [settled(leaf, api, stop=stop) for stop in (None, "not a frame")]
    assert plain == not_a_frame


def test_depth_cut(api: types.SimpleNamespace) -> None:
    one = [settled(f, api, depth=1) for f in (via_a, via_b)]
    assert one[0] == one[1]  # only leaf's own frame: the same
    two = [settled(f, api, depth=2) for f in (via_a, via_b)]
    assert two[0] != two[1]
    deep = [settled(rec, api, n, depth=3) for n in (5, 6)]  # leaf, then two rec frames: the same
    assert deep[0] == deep[1]
    assert len({api.window_hash(0, d, None) for d in range(1, 8)}) == 7  # prefixes: all differ


def test_skip(api: types.SimpleNamespace) -> None:
    skipped = [settled(f, api, skip=1) for f in (leaf, leaf_twin)]  # from settled, at one instruction
    assert skipped[0] == skipped[1]
    own = [settled(f, api, skip=0) for f in (leaf, leaf_twin)]
    assert own[0] != own[1]
    callers = [settled(f, api, skip=1) for f in (via_a, via_b)]  # the windows start at via_a, via_b
    assert callers[0] != callers[1]
    assert api.window_hash(10**6, 5, None) == api.window_hash(0, 0, None)  # past the stack: empty


def test_bad_arguments(api: types.SimpleNamespace) -> None:
    with pytest.raises(ValueError):
        api.window_hash(-1, 5, None)
    with pytest.raises(TypeError):
        api.window_hash(0, 5)
    with pytest.raises(TypeError):
        api.window_hash("0", 5, None)


@pytest.mark.parametrize(("skip", "depth"), [(0, 64), (0, 1), (0, 3), (1, 64), (2, 2), (0, 0), (500, 4)])
def test_window_frames_match_the_walk(api: types.SimpleNamespace, skip: int, depth: int) -> None:
    got, want = frames_and_walk(api, skip, depth, None)
    assert got == want
    assert all(a is b for a, b in zip(got, want, strict=True))


def test_window_frames_stop(api: types.SimpleNamespace) -> None:
    stop = sys._getframe(1)
    got, want = frames_and_walk(api, 0, 64, stop)
    assert got == want and len(got) == 2  # frames_and_walk's and this test's
    got, want = frames_and_walk(api, 2, 64, stop)  # the stop frame inside the skipped ones
    assert got == want


def test_window_in_a_thread_and_a_generator(api: types.SimpleNamespace) -> None:
    out: dict[str, tuple[list[types.FrameType], list[types.FrameType]]] = {}

    def run() -> None:
        out["thread"] = frames_and_walk(api, 0, 64, None)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    got, want = out["thread"]
    assert got == want and got[-1].f_back is None

    def gen():  # type: ignore[no-untyped-def]
        yield frames_and_walk(api, 0, 64, None)

    got, want = next(gen())
    assert got == want and got[1].f_code.co_name == "gen"


def test_implementations_agree_on_which_windows_are_equal() -> None:
    if _fastpath is None:
        pytest.skip(_WHY)

    def paths(api):  # type: ignore[no-untyped-def]
        out = []
        for kw in ({}, {"depth": 1}, {"depth": 2}, {"skip": 1}, {"stop": sys._getframe()}):
            out += [settled(f, api, **kw) for f in (leaf, leaf_twin, via_a, via_b)]
            out += [settled(rec, api, n, **kw) for n in (0, 1, 2, 3)]
        return out

    c, p = paths(COMPILED), paths(PURE)
    same_c = [[x == y for y in c] for x in c]
    same_p = [[x == y for y in p] for x in p]
    assert same_c == same_p
    assert 1 < len(set(c)) < len(c)  # some equal, some not: the comparison says something


def test_hash_is_an_int64(api: types.SimpleNamespace) -> None:
    hashes = [rec(api, n) for n in range(50)]
    assert all(isinstance(h, int) and -(2**63) <= h < 2**63 for h in hashes)
    assert len(set(hashes)) == 50


def test_no_frame_or_code_leaked(api: types.SimpleNamespace) -> None:
    here = sys._getframe()
    code = leaf.__code__
    mine = test_no_frame_or_code_leaked.__code__
    for _ in range(100):  # warm: any cache the first calls fill
        leaf(api, stop=here), leaf(api, skip=1), api.window_frames(0, 64, here)
    gc.collect()
    before = (sys.getrefcount(code), sys.getrefcount(mine), sys.getrefcount(here))
    for _ in range(100_000):
        leaf(api, stop=here)
        leaf(api, skip=1, depth=3)
        api.window_frames(0, 64, here)
    gc.collect()
    assert (sys.getrefcount(code), sys.getrefcount(mine), sys.getrefcount(here)) == before


def test_frames_die_with_their_call(api: types.SimpleNamespace) -> None:
    class Local:
        pass

    def make() -> weakref.ref[Local]:
        obj = Local()
        api.window_hash(0, 64, None)
        frames = api.window_frames(0, 64, None)
        del frames
        return weakref.ref(obj)

    ref = make()
    assert ref() is None  # make's frame (holding obj) was freed on return: nothing kept a reference


def frames_made_by(window_hash, depth: int) -> int:  # type: ignore[no-untyped-def]
    """Memory blocks still held after ``window_hash`` read a window over ``depth`` fresh calls, less
    those before: the frame objects it made, which live as long as their calls (a call that nothing
    asked for its frame object has none; frame objects are not tracked by ``gc`` while they run)."""
    def inner(n: int) -> int:
        if n:
            return inner(n - 1)
        before = sys.getallocatedblocks()
        window_hash(0, 64, None)
        return sys.getallocatedblocks() - before
    window_hash(0, 64, None)  # anything a first call makes once
    return min(inner(depth) for _ in range(3))


@pytest.mark.skipif(not getattr(_fastpath, "RAW_FRAMES", 0),
                    reason=_WHY or "the compiled window reads frame records on CPython 3.11-3.13 only")
def test_compiled_window_makes_no_frame_object() -> None:
    """The compiled window reads the interpreter's frame records: a program's loop calls fresh
    frames at every step, and making a frame object for each (what ``PyFrame_GetBack`` and
    ``f_back`` do) cost 0.4-0.6 µs a malloc over 8 frames. The pure walk, for contrast, makes them."""
    nothing = frames_made_by(lambda *a: None, 8)  # the measurement's own (its int)
    assert frames_made_by(_fastpath.window_hash, 8) == nothing
    assert frames_made_by(fastpath.py_window_hash, 8) >= nothing + 8


# -- the ring ------------------------------------------------------------------------------------


def rows_for(seqs: range | list[int], row_ints: int = 8) -> np.ndarray:
    """The row each test pushes for a seq: seq * 100 + column, the last column negative."""
    out = np.array([[s * 100 + i for i in range(row_ints)] for s in seqs], dtype=np.int64)
    out = out.reshape(-1, row_ints)
    out[:, -1] = -out[:, -1] - 1
    return out


def push_all(ring, n: int, row_ints: int = 8) -> None:  # type: ignore[no-untyped-def]
    for row in rows_for(range(n), row_ints).tolist():
        ring.push(*row)


@pytest.mark.parametrize("n", [0, 1, 5, 16, 17, 100, 1003])
def test_ring_reads_back_the_last_rows_in_order(api: types.SimpleNamespace, n: int) -> None:
    buf = bytearray(ring_bytes(16))
    ring = api.Ring(buf)
    assert (ring.nslots, ring.row_ints, ring.seq) == (16, 8, 0)
    push_all(ring, n)
    assert ring.seq == n
    rows, seqs = read_ring(buf)
    first = max(0, n - 16)
    assert seqs.tolist() == list(range(first, n))
    np.testing.assert_array_equal(rows, rows_for(range(first, n)))
    assert rows.dtype == np.int64 and rows.shape == (n - first, 8)
    rows, seqs = read_ring(buf, since=n - 3)
    assert seqs.tolist() == list(range(max(first, n - 3), n))


def test_ring_header_and_layout(api: types.SimpleNamespace) -> None:
    buf = bytearray(ring_bytes(5, 3) + 17)  # a tail too short for a slot is unused
    ring = api.Ring(buf, row_ints=3)
    assert (ring.nslots, ring.row_ints) == (5, 3)
    assert ring_header(buf) == (3, 5)
    words = np.frombuffer(bytes(buf[:64]), dtype=np.int64)
    assert words.tolist() == [MAGIC, 1, 3, 5, 8, 4, 0, 0]
    ring.push(7, 8, 9)
    slot0 = np.frombuffer(bytes(buf[64:96]), dtype=np.int64)
    assert slot0.tolist() == [7, 8, 9, 1]  # the row, then seq + 1
    push_all(ring, 6, 3)  # a new Ring would clear it; these continue at seq 1
    assert read_ring(buf)[1].tolist() == [2, 3, 4, 5, 6]


def test_ring_constants_agree() -> None:
    if _fastpath is None:
        pytest.skip(_WHY)
    assert (_fastpath.MAGIC, _fastpath.VERSION, _fastpath.HEADER_INTS, _fastpath.MAX_ROW) == \
        (fastpath.MAGIC, fastpath.VERSION, fastpath.HEADER_INTS, fastpath.MAX_ROW)


def test_torn_slots_are_not_returned(api: types.SimpleNamespace) -> None:
    buf = bytearray(ring_bytes(8))
    ring = api.Ring(buf)
    push_all(ring, 12)  # slots hold seqs 8..11 (slots 0..3) and 4..7 (slots 4..7)
    words = np.frombuffer(buf, dtype=np.int64)
    body = words[8:].reshape(8, 9)
    body[2, 8] = 0  # seq 10 being written: its marker cleared, the row half new
    body[2, :4] = -5
    body[5, 8] = 3  # a marker that no seq of slot 5 can have (3 % 8 != 5)
    del words, body
    rows, seqs = read_ring(buf)
    assert seqs.tolist() == [4, 6, 7, 8, 9, 11]
    np.testing.assert_array_equal(rows, rows_for([4, 6, 7, 8, 9, 11]))


def test_ring_rejects_bad_rows_and_buffers(api: types.SimpleNamespace) -> None:
    buf = bytearray(ring_bytes(4))
    ring = api.Ring(buf)
    push_all(ring, 3)
    with pytest.raises(TypeError):
        ring.push(1, 2, 3)
    with pytest.raises(TypeError):
        ring.push(*range(7), "x")
    with pytest.raises(OverflowError):
        ring.push(*range(7), 2**63)
    ring.push(*range(7), -(2**63))  # the int64 range's ends
    ring.push(*range(7), 2**63 - 1)
    assert ring.seq == 5
    assert read_ring(buf)[1].tolist() == [1, 2, 3, 4]
    with pytest.raises(ValueError):
        api.Ring(bytearray(64 + 8 * 9 - 1))
    with pytest.raises(ValueError):
        api.Ring(bytearray(ring_bytes(4)), row_ints=0)
    with pytest.raises(BufferError):
        api.Ring(bytes(ring_bytes(4)))
    with pytest.raises(ValueError):
        read_ring(bytearray(ring_bytes(4)))  # no ring written there


def test_compiled_ring_unchanged_by_a_bad_row() -> None:
    if _fastpath is None:
        pytest.skip(_WHY)
    buf = bytearray(ring_bytes(4))
    ring = _fastpath.Ring(buf)
    push_all(ring, 6)
    before = bytes(buf)
    with pytest.raises(OverflowError):
        ring.push(*range(7), 2**64)
    assert bytes(buf) == before and ring.seq == 6  # converted before anything is written


def test_ring_close_releases_the_mmap(api: types.SimpleNamespace, tmp_path: Path) -> None:
    path = tmp_path / "ring"
    path.write_bytes(bytes(ring_bytes(4)))
    with path.open("r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
    ring = api.Ring(mm)
    ring.push(*range(8))
    with pytest.raises(BufferError):
        mm.close()  # the ring holds it
    ring.close()
    assert ring.closed
    with pytest.raises(ValueError):
        ring.push(*range(8))
    read_ring(mm)  # the reader holds no view after it returns
    mm.close()


def test_ring_refcounts_stable(api: types.SimpleNamespace) -> None:
    buf = bytearray(ring_bytes(64))
    ring = api.Ring(buf)
    big = 2**40 + 12345
    row = (big, -1, 2, 3, 4, 5, 6, big)
    push = ring.push
    for _ in range(100):
        push(*row)
    before = (sys.getrefcount(buf), sys.getrefcount(big), sys.getrefcount(row))
    for _ in range(100_000):
        push(*row)
    assert (sys.getrefcount(buf), sys.getrefcount(big), sys.getrefcount(row)) == before
    assert ring.seq == 100_100


READER = textwrap.dedent("""
    import json, mmap, sys
    from tracekit.record.fastpath import read_ring
    with open(sys.argv[1], "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    rows, seqs = read_ring(mm, since=int(sys.argv[2]))
    print(json.dumps({"rows": rows.tolist(), "seqs": seqs.tolist()}))
""")


def _env(pure: bool) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    env.pop("TRACEKIT_PURE_PYTHON", None)
    if pure:
        env["TRACEKIT_PURE_PYTHON"] = "1"
    return env


def test_ring_read_from_another_process(api: types.SimpleNamespace, tmp_path: Path) -> None:
    path = tmp_path / "ring"
    path.write_bytes(bytes(ring_bytes(32)))
    with path.open("r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
    ring = api.Ring(mm)
    push_all(ring, 75)
    for since in (0, 60):
        p = subprocess.run([sys.executable, "-c", READER, str(path), str(since)], capture_output=True,
                           text=True, env=_env(api is PURE), check=True, timeout=120)
        got = json.loads(p.stdout)
        want = list(range(max(43, since), 75))
        assert got["seqs"] == want
        assert got["rows"] == rows_for(want).tolist()
    ring.close()
    mm.close()


WRITER = textwrap.dedent("""
    import mmap, sys, time
    from tracekit.record.fastpath import Ring
    with open(sys.argv[1], "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0)
    ring = Ring(mm)
    push = ring.push
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    s = 0
    while time.monotonic() < end:
        for _ in range(1000):
            b = s * 100
            push(b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, -(b + 7) - 1)
            s += 1
    print(s, flush=True)
""")


def test_ring_against_a_live_writer(api: types.SimpleNamespace, tmp_path: Path) -> None:
    """A writer process laps a small ring while this process reads it: every row read is whole."""
    path = tmp_path / "ring"
    path.write_bytes(bytes(ring_bytes(8)))
    with path.open("r+b") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    with subprocess.Popen([sys.executable, "-c", WRITER, str(path), "1.5"], stdout=subprocess.PIPE, text=True,
                          env=_env(api is PURE)) as w:
        try:
            assert w.stdout is not None and w.stdout.readline().strip() == "ready"
            reads = got = 0
            while w.poll() is None:
                rows, seqs = read_ring(mm)
                reads += 1
                got += len(seqs)
                assert np.all(np.diff(seqs) > 0)
                np.testing.assert_array_equal(rows, rows_for(seqs.tolist()))
            assert w.returncode == 0
            pushed = int(w.stdout.readline())
        finally:
            if w.poll() is None:
                w.kill()
    rows, seqs = read_ring(mm)
    assert seqs.tolist() == list(range(pushed - 8, pushed))
    assert reads > 10 and got > 0
    mm.close()


def test_pure_python_forced_by_the_environment() -> None:
    script = ("from tracekit.record import fastpath as f; "
              "print(f.COMPILED, f.window_hash is f.py_window_hash, f.Ring is f.PyRing)")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(True),
                       check=True, timeout=120)
    assert p.stdout.split() == ["False", "True", "True"]
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=_env(False),
                       check=True, timeout=120)
    want = ["True", "False", "False"] if _fastpath is not None else ["False", "True", "True"]
    assert p.stdout.split() == want


def test_rows_extend_mirrors_each_row_into_the_ring_in_order() -> None:
    """``Rows.extend`` (what the recorder's rows go through, ``record.tail``): the rows get the ints,
    the mirrored ring one row per ``row_ints`` of them, in their order; after the ring's ``close``
    only the rows."""
    if not fastpath.COMPILED:
        pytest.skip("the compiled helper is not built (pip install -e . with a C compiler)")
    buf = mmap.mmap(-1, fastpath.ring_bytes(4, 8))
    ring = fastpath.Ring(buf, 8)
    rows = fastpath.Rows(8)
    rows.mirror(ring)
    for i in range(3):
        rows.extend((i, *range(1, 8)))
    rows.extend(tuple(range(100, 116)))  # an event row and its note row, in one call
    assert len(rows) == 5 * 8 and ring.seq == 5
    got, seqs = fastpath.read_ring(buf)
    assert seqs.tolist() == [1, 2, 3, 4]  # the last four (four slots)
    assert got.reshape(-1).tolist() == rows[8:]
    ring.close()
    rows.extend((7,) * 8)
    assert len(rows) == 6 * 8 and rows[40:] == [7] * 8
    del got, seqs
    buf.close()


@pytest.mark.parametrize("impl", ["compiled", "pure"])
def test_rows_hold_whole_rows_and_copy_them_as_the_spool_writes_them(impl: str) -> None:
    """Both ``Rows`` (the C one: whole rows only, nothing appended by a bad call), ``del`` of written
    rows, the limits, and ``copy_into``/``to_bytes`` giving little-endian int64 (the spool's ROWS
    layout)."""
    if impl == "compiled" and not fastpath.COMPILED:
        pytest.skip("the compiled helper is not built (pip install -e . with a C compiler)")
    rows = fastpath.Rows(4) if impl == "compiled" else fastpath.PyRows(4)
    rows.extend((1, -2, 2**62, -(2**63)))
    if impl == "compiled":  # the C one checks and converts first: a bad call appends nothing
        with pytest.raises(ValueError):
            rows.extend((1, 2, 3))  # not a whole row
        with pytest.raises(OverflowError):
            rows.extend((1, 2, 3, 2**64))
        with pytest.raises(TypeError):
            rows.extend((1, 2, "3", 4))
        with pytest.raises(ValueError):
            del rows[1:3]  # would cut a row
    assert len(rows) == 4
    rows.extend(tuple(range(10, 10 + 4 * 300)))  # past the first allocation
    assert len(rows) == 4 * 301 and rows[:4] == [1, -2, 2**62, -(2**63)] and rows[-1] == 10 + 4 * 300 - 1
    out = bytearray(16 + 8 * len(rows))
    assert rows.copy_into(out, 16, 0, len(rows)) == 8 * len(rows)
    assert np.frombuffer(bytes(out[16:]), "<i8").tolist() == rows[:]
    assert rows.to_bytes(4, 8) == bytes(out[16 + 32:16 + 64])
    del rows[:4]
    assert len(rows) == 4 * 300 and rows[0] == 10
    rows.due, rows.cap = 5, 7
    assert (rows.due, rows.cap) == (5, 7)
    del rows[:]
    assert len(rows) == 0 and rows.to_bytes(0, 0) == b""
    with pytest.raises((TypeError, ValueError)):
        rows.mirror(object())  # type: ignore[arg-type]
