"""``tracekit record`` keeps whole stacks, over the CuPy stand-in: the frames of a malloc three calls
deep, their kinds, --stack-depth, --no-sites, and ``tracekit recover`` after a kill."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from test_record_fake_cupy import (  # the stand-in recording helpers (tests/cli on the path)
    _env,
    _record,
    _start,
)

from tracekit.cli.record import STACK_DEPTH
from tracekit.record.callstacks import DEFAULT_DEPTH
from tracekit.trace import Op, read_trace
from tracekit.trace.stacks import FrameKind

PROGRAM = """
    import threading
    import cupy


    def inner():
        return cupy.empty(1000)


    def middle():
        return inner()


    def outer():
        return middle()


    a = outer()
    t = threading.Thread(target=outer)
    t.start()
    t.join()
    del a
"""


def _mallocs(path: Path) -> list[list[tuple[str, int, str, FrameKind]]]:
    t = read_trace(path, strict=True)
    ev = t.events
    out = []
    for i in np.flatnonzero(ev.op == Op.MALLOC):
        out.append([(f.file, f.line, f.function, f.kind) for f in ev.stacks.frames(int(ev.stack[i]))])
    assert np.all(ev.stack[ev.op == Op.FREE] == -1)
    return out


def test_a_malloc_three_calls_deep_names_those_frames_and_ends_at_the_program(tmp_path: Path) -> None:
    r = _record(tmp_path, PROGRAM, "-o", "t.parquet")
    assert r.returncode == 0, r.stderr
    main, thread = _mallocs(tmp_path / "t.parquet")
    user = [f for f in main if f[0] == "app.py"]
    assert [(f[1], f[2]) for f in user] == [(7, "inner"), (11, "middle"), (15, "outer"), (18, "<module>")]
    assert main[-1][:3] == ("app.py", 18, "<module>")  # the launcher's frames are not the program's
    assert all(f[3] is FrameKind.USER for f in user)
    assert any(f[2] == "empty" for f in main[:main.index(user[0])])  # CuPy's Python frames stay, inside
    assert not any("tracekit" in f[0] for f in main + thread)
    # in the thread: the same three, then threading's own frames (the standard library)
    assert [(f[1], f[2]) for f in thread if f[0] == "app.py"] == [(7, "inner"), (11, "middle"), (15, "outer")]
    std = [f for f in thread if f[0] == "threading.py"]
    assert std and all(f[3] is FrameKind.STDLIB for f in std)
    t = read_trace(tmp_path / "t.parquet")
    assert t.meta.extra["recorder"]["stack_depth"] == DEFAULT_DEPTH == STACK_DEPTH
    # the one-frame site is what it always was
    mallocs = np.flatnonzero(t.events.op == Op.MALLOC)
    assert {t.events.site_name(int(i)) for i in mallocs} == {"app.py:7:inner"}


def _from_site(stack: list[tuple[str, int, str, FrameKind]]) -> list[tuple[str, int, str, FrameKind]]:
    """The frames of ``stack`` from the call-site outwards, after checking that only CuPy's lie inside."""
    first = next(i for i, f in enumerate(stack) if f[0] == "app.py")
    assert first > 0 and all("cupy" in f[0] for f in stack[:first]), stack
    return stack[first:]


def test_stack_depth_counts_frames_from_the_call_site(tmp_path: Path) -> None:
    r = _record(tmp_path, PROGRAM, "-o", "t.parquet", "--stack-depth", "4")
    assert r.returncode == 0, r.stderr
    main, thread = (_from_site(s) for s in _mallocs(tmp_path / "t.parquet"))
    assert [(f[1], f[2]) for f in main] == [(7, "inner"), (11, "middle"), (15, "outer"), (18, "<module>")]
    assert [(f[1], f[2]) for f in thread[:3]] == [(7, "inner"), (11, "middle"), (15, "outer")]
    assert len(thread) == 4 and thread[3][0] == "threading.py"  # 4 frames, CuPy's not among them
    assert read_trace(tmp_path / "t.parquet").meta.extra["recorder"]["stack_depth"] == 4


def test_stack_depth_1_keeps_the_users_line_that_analyze_names(tmp_path: Path) -> None:
    """CuPy's frames never use up the depth: one frame is the user's line, not CuPy's pool."""
    kept = PROGRAM.replace("del a\n", "")  # the main thread's array still live at the end: analyze names it
    assert kept != PROGRAM
    r = _record(tmp_path, kept, "-o", "t.parquet", "--stack-depth", "1")
    assert r.returncode == 0, r.stderr
    for stack in _mallocs(tmp_path / "t.parquet"):
        assert _from_site(stack) == [("app.py", 7, "inner", FrameKind.USER)]
    out = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "t.parquet"], capture_output=True,
                         text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "app.py:7:inner" in out.stdout and "memory.py" not in out.stdout, out.stdout


def test_no_sites_records_no_stacks_and_depth_0_the_site_alone(tmp_path: Path) -> None:
    assert _record(tmp_path, PROGRAM, "-o", "n.parquet", "--no-sites").returncode == 0
    ev = read_trace(tmp_path / "n.parquet").events
    assert np.all(ev.stack == -1) and ev.stacks.n_stacks == 0
    assert _record(tmp_path, PROGRAM, "-o", "z.parquet", "--stack-depth", "0").returncode == 0
    t = read_trace(tmp_path / "z.parquet")
    np.testing.assert_array_equal(t.events.stack, t.events.site)  # the sites as one-frame stacks
    assert t.meta.extra["recorder"]["stack_depth"] == 0


def test_a_bad_stack_depth_is_a_usage_error(tmp_path: Path) -> None:
    r = _record(tmp_path, PROGRAM, "--stack-depth", "-1")
    assert r.returncode == 2 and "--stack-depth" in r.stderr and "Traceback" not in r.stderr
    r = _record(tmp_path, PROGRAM, "--torch", "--stack-depth", "5")
    assert r.returncode == 2 and "--async-pools and --rmm apply to CuPy recordings" in r.stderr


def test_recover_after_a_kill_keeps_the_stacks(tmp_path: Path) -> None:
    program = """
        import time, cupy

        def make(n):
            return cupy.empty(n)

        def step(k):
            return make(512 * (k + 1))

        keep = []
        for k in range(3):
            keep.append(step(k))
        time.sleep(1.5)  # past the spool's flush interval
        print("ready", flush=True)
        time.sleep(60)
    """
    proc = _start(tmp_path, program)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.communicate(timeout=60)
    # the recorder's watcher finished the spool into the trace (the reader waits for it)
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert not (tmp_path / "t.parquet.spool").exists()
    assert t.meta.extra["complete"] is False
    stacks = _mallocs(tmp_path / "t.parquet")
    assert len(stacks) == 3
    for stack in stacks:
        mine = [(f[1], f[2]) for f in stack if f[0] == "app.py"]
        assert mine == [(5, "make"), (8, "step"), (12, "<module>")]
