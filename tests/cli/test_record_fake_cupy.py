"""Whole recordings on the CPU: ``tracekit record`` in a child process over a stand-in for CuPy.

``tests/fakecupy`` follows CuPy 14.2's memory API where the recorder depends
on it (see its docstring), including the per-device pools that all report
the device current when the pool was first used. The child runs the real
command line; only CuPy is replaced. These tests cover what needs a whole
process: every pool kind, two devices, the launcher's rank in the file name,
and a SIGTERM from a launcher that must still leave a finished trace.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from tracekit.trace import Op, read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"
MiB = 1 << 20


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK")}
    return {**env, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "PYTHONUNBUFFERED": "1", **extra}


def _record(tmp: Path, program: str, *opts: str, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp / "app.py").write_text(textwrap.dedent(program))
    cmd = [sys.executable, "-m", "tracekit", "record", *opts, "app.py"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=_env(**env), timeout=120)


def _start(tmp: Path, program: str) -> subprocess.Popen[str]:
    """``tracekit record -o t.parquet app.py`` of ``program``, running (for tests that signal or kill it)."""
    (tmp / "app.py").write_text(textwrap.dedent(program))
    cmd = [sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", "app.py"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp,
                            env=_env())


PROGRAM = """
    import cupy
    a = cupy.empty(1000)
    user = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(user.malloc)
    b = [cupy.empty(MiB) for _ in range(3)]
    fast = cupy.cuda.MemoryAsyncPool()
    cupy.cuda.set_allocator(fast.malloc)
    c = cupy.empty(5000)
    d = cupy.empty(7000)
    del c
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    with cupy.cuda.Device(1):
        e = cupy.empty(2 * MiB)
        cupy.get_default_memory_pool().set_limit(size=4 * MiB)
        f = cupy.empty(3 * MiB)
""".replace("MiB", str(MiB))


def test_every_pool_kind_on_two_devices(tmp_path: Path) -> None:
    p = _record(tmp_path, PROGRAM, "-o", "t.parquet", "--async-pools", FAKECUPY_DEVICES="2")
    assert p.returncode == 1 and "OutOfMemoryError" in p.stderr and "Wrote t.parquet" in p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert t.meta.schema_version == 3 and t.extras is not None
    pools = t.meta.extra["pools"]
    assert [(e["id"], e["device"], e["kind"], e["label"]) for e in pools] == [
        (0, 0, "pool", "default"), (1, 0, "pool", "user 1"), (2, 0, "async", "async 1"),
        (3, 1, "pool", "default")]
    assert pools[3]["limit_bytes"] == 4 * MiB
    ev = t.events
    col = t.extras.column("pool").to_pylist()
    by_pool = {k: [Op(int(ev.op[i])).label for i in range(len(ev)) if col[i] == k] for k in range(4)}
    assert by_pool[1] == ["segment_alloc", "malloc"] * 3
    assert by_pool[2] == ["malloc", "malloc", "free"]  # the async pool's own rows, no segments
    assert by_pool[3] == ["segment_alloc", "malloc", "oom"]
    # device 1's rows say device 1 although CuPy's hook said 0 for them
    assert set(ev.device[np.array(col) == 3].tolist()) == {1}
    assert t.meta.extra["device_mismatches"] == 2
    dfree = t.extras.column("device_free").to_pylist()
    measured = [(ev.op[i] not in (Op.MALLOC, Op.FREE)) or col[i] == 2 for i in range(len(ev))]
    assert [d is not None for d in dfree] == measured  # device-level rows and the async pool's
    (state,) = t.meta.extra["oom_states"]
    assert state["device"] == 1 and state["pool"]["limit_bytes"] == 4 * MiB
    assert state["limits"] == {"stack_size": 1024, "printf_fifo_size": MiB, "malloc_heap_size": 8 * MiB}
    ex = t.meta.extra["exit"]
    assert ex == {**ex, "status": "exception", "exception": "cupy.cuda.memory.OutOfMemoryError", "code": 1,
                  "signal": None, "oom_seq": state["seq"]}
    # call-sites relative to the working directory
    assert {ev.site_name(i) for i in np.flatnonzero(ev.op == Op.MALLOC)} >= {"app.py:3:<module>"}


def test_launcher_rank_goes_into_the_name_and_placeholders_are_filled(tmp_path: Path) -> None:
    ok = "import cupy\na = cupy.empty(4096)\n"
    p = _record(tmp_path, ok, "-o", "job.parquet", RANK="3", LOCAL_RANK="1", WORLD_SIZE="4")
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "job.parquet").exists() and "Wrote job.rank3.parquet" in p.stderr
    launch = read_trace(tmp_path / "job.rank3.parquet").meta.extra["launch"]
    got = (launch["rank"], launch["local_rank"], launch["world_size"], launch["launcher"])
    assert got == (3, 1, 4, "RANK")
    p = _record(tmp_path, ok, "-o", "mpi-{rank}-of-{world_size}.parquet", OMPI_COMM_WORLD_RANK="2",
                OMPI_COMM_WORLD_SIZE="8")
    assert p.returncode == 0 and (tmp_path / "mpi-2-of-8.parquet").exists(), p.stderr


def test_sigterm_kills_the_program_as_without_tracekit_and_the_watcher_writes_every_row(
        tmp_path: Path) -> None:
    """A launcher's SIGTERM: the program dies of it (as ``python app.py`` would, even a program that
    catches every exception, as pytest does), and the watcher writes the trace, every malloc in it."""
    program = """
        import time, cupy
        keep = [cupy.empty(4096 * (i + 1)) for i in range(5)]
        print("ready", flush=True)
        try:
            time.sleep(60)
        except BaseException:  # swallows any exception: only the signal's own action ends it
            time.sleep(60)
    """
    proc = _start(tmp_path, program)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, err
    assert "Traceback" not in err
    t = read_trace(tmp_path / "t.parquet", strict=True)  # waits for the watcher
    assert not (tmp_path / "t.parquet.spool").exists()
    assert t.meta.extra["complete"] is False and t.events.count(Op.MALLOC) == 5
    assert "signal" in t.meta.extra["ended"]


def test_a_killed_recording_recovers_with_its_pools_and_oom_states(tmp_path: Path) -> None:
    program = """
        import time, cupy
        user = cupy.cuda.MemoryPool()
        user.set_limit(size=3 * MiB)
        cupy.cuda.set_allocator(user.malloc)
        keep = [cupy.empty(MiB) for _ in range(3)]
        try:
            cupy.empty(MiB)
        except cupy.cuda.memory.OutOfMemoryError:
            print("handled", flush=True)
        time.sleep(1.5)  # past the spool's flush interval
        print("ready", flush=True)
        time.sleep(60)
    """.replace("MiB", str(MiB))
    proc = _start(tmp_path, program)
    assert proc.stdout is not None
    assert [proc.stdout.readline().strip() for _ in range(2)] == ["handled", "ready"]
    proc.kill()
    proc.communicate(timeout=60)
    # The recorder's watcher turns the spool into the trace (no `tracekit recover` by hand); the
    # reader waits for it.
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert not (tmp_path / "t.parquet.spool").exists()
    r = subprocess.run([sys.executable, "-m", "tracekit", "recover", "t.parquet.spool"],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=60)
    assert r.returncode == 1 and "nothing to recover" in r.stderr, r.stderr
    m = t.meta.extra
    assert m["complete"] is False and "exit" not in m and m["finished_by"] == "watcher"
    assert [(e["id"], e["label"]) for e in m["pools"]] == [(0, "default"), (1, "user 1")]
    # the user pool: 3 segments, 3 mallocs and the oom
    assert t.extras is not None and t.extras.column("pool").to_pylist().count(1) == 7
    (state,) = m["oom_states"]
    assert t.events.op[state["seq"]] == Op.OOM and state["pool"]["limit_bytes"] == 3 * MiB


def test_the_recorded_script_is_never_the_output_even_with_force(tmp_path: Path) -> None:
    ok = "import cupy\na = cupy.empty(4096)\n"
    p = _record(tmp_path, ok, "-o", "app.py", "--force")
    assert p.returncode == 1 and "refusing to overwrite the input app.py" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert (tmp_path / "app.py").read_text() == ok
    (tmp_path / "link.py").symlink_to("app.py")  # the same file under another name
    p = _record(tmp_path, ok, "-o", "link.py", "--force")
    assert p.returncode == 1 and (tmp_path / "app.py").read_text() == ok


def test_a_limit_the_program_sets_itself_is_the_limit_advise_answers_at(tmp_path: Path) -> None:
    """The program caps CuPy's pool itself once recording has begun and dies at that cap: the start
    metadata has no limit, the OOM's measured state and the pool as the program left it have the
    program's; advise answers at it, and names it as the program's own to lift for a whole-run
    recording (it answered at the device's size before, and called the OOM unexplained)."""
    program = """
        import cupy
        cupy.get_default_memory_pool().set_limit(size=8 * MiB)
        kept = [cupy.empty(MiB) for _ in range(12)]
    """.replace("MiB", str(MiB))
    p = _record(tmp_path, program, "-o", "t.parquet")
    assert p.returncode == 1 and "OutOfMemoryError" in p.stderr, p.stderr
    t = read_trace(tmp_path / "t.parquet", strict=True)
    assert t.meta.pool_limit_bytes is None  # read before the program ran
    (state,) = t.meta.extra["oom_states"]
    assert state["pool"]["limit_bytes"] == 8 * MiB
    r = subprocess.run([sys.executable, "-m", "tracekit", "advise", "t.parquet", "--json", "-j", "1"],
                       capture_output=True, text=True, cwd=tmp_path, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr  # a raised set_limit fits
    answer = json.loads(r.stdout)
    assert answer["limit_bytes"] == 8 * MiB and answer["limit_is"] == "limit"
    assert "the limit the program sets itself (8388608 bytes in the recording)" in answer["recommendation"]
    assert "the trace does not explain the failure" not in answer["recommendation"]


def test_a_killed_recordings_limit_is_records(tmp_path: Path) -> None:
    """Killed before its end, a recording's ``pools`` entries do not say the pools' limits (the recorder
    reads them at the program's normal end): ``record --limit``'s, from the start, is the one advise
    and replay answer at, not none."""
    program = """
        import os, signal, time, cupy
        keep = [cupy.empty(MiB) for _ in range(3)]
        for _ in range(3000):  # rows enough for the spool to be written, with its note of the pools
            del keep[-1]
            keep.append(cupy.empty(4096))
        time.sleep(1.5)
        os.kill(os.getpid(), signal.SIGKILL)
    """.replace("MiB", str(MiB))
    p = _record(tmp_path, program, "--limit", "8MiB", "-o", "t.parquet")
    assert p.returncode == -signal.SIGKILL or p.returncode == 128 + signal.SIGKILL, p.stderr
    t = read_trace(tmp_path / "t.parquet")
    assert t.meta.extra["complete"] is False and t.meta.pool_limit_bytes == 8 * MiB
    assert [e.get("limit_bytes") for e in t.meta.extra["pools"]] == [None]  # not read: killed
    env = _env()
    r = subprocess.run([sys.executable, "-m", "tracekit", "advise", "t.parquet", "--json", "-j", "1"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["limit_bytes"] == 8 * MiB
    r = subprocess.run([sys.executable, "-m", "tracekit", "replay", "t.parquet", "--sim", "cupy"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 0 and "replaying under the recorded pool limit of 8.00 MiB" in r.stderr, r.stderr
