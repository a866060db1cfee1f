"""Every recording ends as a trace, however the program ends (the CuPy stand-in, whole processes).

A program that ends by ``os._exit``, ``exec``, SIGKILL, or breaks what the finishing code needs
(``json.dumps = None``, ``sys.setrecursionlimit(40)``) leaves a readable trace at its output and no
spool: the recorder's watcher (``tracekit.record.watch``) finishes it, and the next command reads it
(it waits for the watcher). The program's exit status stays its own (SIGKILL stays -9), a program
that closes every descriptor or forks is recorded whole, ``os.wait()`` sees no child of tracekit's,
and no watcher outlives the run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tracekit.record.fastpath import COMPILED
from tracekit.trace import Op, read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"


pytestmark = pytest.mark.watcher

HEAD = """
    import json, os, signal, sys, time
    import cupy
    keep = [cupy.empty(1 << 20) for _ in range(20)]
    time.sleep(0.8)  # past the flush interval: these rows are in the spool
    more = [cupy.empty(1 << 20) for _ in range(3)]
    print("allocated", flush=True)
"""
ENDS = {
    "os._exit": ("os._exit(3)", 3),
    "exec": ("os.execv('/bin/sh', ['/bin/sh', '-c', 'exit 0'])", 0),
    "SIGKILL": ("os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    "json broken": ("json.dumps = None; json.loads = None", 0),
    "recursion limit": ("sys.setrecursionlimit(40)", 0),
}


KILLED = ("os._exit", "exec", "SIGKILL")


def _record(tmp: Path, program: str) -> subprocess.CompletedProcess[str]:
    (tmp / "app.py").write_text(textwrap.dedent(program))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    return subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", "app.py"],
                          capture_output=True, text=True, cwd=tmp, env=env, timeout=120)


def _watchers(folder: Path) -> int:
    """Watcher processes still running for a trace in ``folder`` (read from /proc: no ps needed)."""
    n = 0
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        n += b"tracekit.record.watch" in args and any(str(folder).encode() in a for a in args)
    return n


@pytest.mark.parametrize("end", list(ENDS))
def test_every_end_leaves_a_trace(tmp_path: Path, end: str) -> None:
    code, status = ENDS[end]
    p = _record(tmp_path, HEAD + f"    {code}\n")
    assert p.returncode == status, p.stderr
    assert "allocated" in p.stdout and "Traceback" not in p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)  # waits for the watcher, if it is still writing
    mallocs = int((t.events.op == Op.MALLOC).sum())
    # Every malloc is there: those flushed before the end from the spool, the last three (made after
    # the last spool write) from the shared ring the process's death cannot take (record.tail). Only
    # without the compiled helper is there no ring: the last interval may then be lost.
    assert mallocs == 23 if COMPILED or end not in KILLED else mallocs >= 20
    if end in KILLED and COMPILED:
        assert t.meta.extra["tail_rows"] >= 3 and t.meta.extra["tail_rows_lost"] == 0
    for left in ("t.parquet.spool", "t.parquet.finishing", "t.parquet.spool.tail"):
        assert not (tmp_path / left).exists(), left
    if end in KILLED:
        ended = t.meta.extra["ended"]
        assert t.meta.extra["complete"] is False and ("without finishing" in ended or "exec" in ended)
    time.sleep(0.2)
    assert _watchers(tmp_path) == 0


def test_the_next_command_sees_the_trace(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(HEAD + "    os._exit(0)\n"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    py = sys.executable
    shell = f"{py} -m tracekit record -o t.parquet app.py && {py} -m tracekit info t.parquet"
    p = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "malloc" in p.stdout and "no such file" not in p.stderr


def test_a_program_that_closes_descriptors_forks_and_waits_is_recorded_whole(tmp_path: Path) -> None:
    p = _record(tmp_path, """
        import os, time
        import cupy
        a = [cupy.empty(1 << 20) for _ in range(5)]
        os.closerange(3, 4096)
        pid = os.fork()
        if pid == 0:
            c = [cupy.empty(1 << 20) for _ in range(4)]  # the child's: never in the parent's trace or ring
            os._exit(0)
        os.waitpid(pid, 0)
        try:
            os.wait()
            print("a child of tracekit's")
        except ChildProcessError:
            print("no other children")
        time.sleep(0.3)
        b = [cupy.empty(1 << 20) for _ in range(5)]
    """)
    assert p.returncode == 0 and "no other children" in p.stdout, p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert int((t.events.op == Op.MALLOC).sum()) == 10 and t.meta.extra["complete"] is True


def test_no_mark_is_left_once_record_returns(tmp_path: Path) -> None:
    for k in range(5):  # record returns only after the watcher has removed its mark
        p = _record(tmp_path, f"""
            import cupy
            a = cupy.empty({k + 1} << 20)
        """)
        assert p.returncode == 0, p.stderr
        assert sorted(x.name for x in tmp_path.iterdir()) == ["app.py", "t.parquet"]
        (tmp_path / "t.parquet").unlink()


@pytest.mark.skipif(not COMPILED, reason="the shared ring of the last rows needs the compiled helper "
                    "(tracekit.record._fastpath, built by pip install -e . where a C compiler exists)")
def test_sigkill_from_outside_mid_loop_keeps_every_malloc_the_program_counted(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent("""
        import os
        import cupy
        n = 0
        while True:
            a = cupy.empty(1 << 10)
            n += 1
            with open("count.tmp", "w") as f:  # the program's own count, after each malloc
                f.write(str(n))
            os.replace("count.tmp", "count")
    """))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}"}
    p = subprocess.Popen([sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", "app.py"],
                         cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (tmp_path / "count").exists() or int((tmp_path / "count").read_text() or 0) < 300:
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.kill()  # SIGKILL: record runs the program in its own process
    p.wait(timeout=30)
    counted = int((tmp_path / "count").read_text())
    t = read_trace(tmp_path / "t.parquet", strict=True)
    mallocs = int((t.events.op == Op.MALLOC).sum())
    # every malloc the program counted is there; at most the one it made but had not yet counted more
    assert counted <= mallocs <= counted + 1
    assert t.meta.extra["complete"] is False and t.meta.extra["tail_rows"] > 0
    assert not (tmp_path / "t.parquet.spool.tail").exists()


INTERRUPTS = {"raise": "raise KeyboardInterrupt",
              "SIGINT": "os.kill(os.getpid(), signal.SIGINT); time.sleep(5)"}


@pytest.mark.parametrize("end", list(INTERRUPTS.values()), ids=list(INTERRUPTS))
def test_a_program_ended_by_keyboard_interrupt_dies_of_sigint_as_under_python(tmp_path: Path,
                                                                               end: str) -> None:
    """Python re-raises SIGINT when a KeyboardInterrupt ends the program; record does the same once the
    trace is written, so the shell sees the program's own status."""
    (tmp_path / "plain.py").write_text(f"import os, signal, time\n{end}\n")
    plain = subprocess.run([sys.executable, "plain.py"], capture_output=True, cwd=tmp_path, timeout=60)
    p = _record(tmp_path, HEAD + f"    {end}\n")
    assert p.returncode == plain.returncode == -signal.SIGINT, p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert "Wrote t.parquet" in p.stderr and int((t.events.op == Op.MALLOC).sum()) == 23
