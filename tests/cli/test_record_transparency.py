"""A recorded program is its own: output, exit code, imports and CuPy's names, whatever it does.

Each program here runs twice over the CuPy stand-in (``tests/fakecupy``), once as
``python app.py`` and once as ``tracekit record ... app.py``, each in a folder of its own:
stdout, stderr less tracekit's own lines (``Wrote ...``, ``tracekit: ...``) and the exit code
must be equal, and the trace must hold what the program did. The stand-in checks CuPy's
extension types the way Cython's import does (``cupy._cython_import``), so the 0.2 recorder,
which put Python subclasses under ``cupy.cuda.MemoryPool``, fails the first test with
``KeyError: '__pyx_vtable__'`` as ``cupyx._cusolver`` did on the H200. The others are the
programs that misbehave: one that changes folder, forks, closes every descriptor it did not
open, drops or closes its standard streams, or fills the disk under the spool.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from test_record_fake_cupy import FAKE, _env

from tracekit.record.fastpath import COMPILED
from tracekit.trace import Op, read_trace

KiB = 1 << 10


def _run(folder: Path, program: str, argv: list[str],
         env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "app.py").write_text(textwrap.dedent(program))
    return subprocess.run(argv, capture_output=True, text=True, cwd=folder, env=env, timeout=120)


def own_lines(stderr: str) -> str:
    """stderr without tracekit's own lines."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not line.startswith(("Wrote ", "tracekit: ")))


def both(tmp: Path, program: str, *opts: str, **env: str) -> tuple[subprocess.CompletedProcess[str],
                                                                    subprocess.CompletedProcess[str]]:
    """(``python app.py``, ``tracekit record -o t.parquet OPTS app.py``), each in its own folder."""
    plain_env = {**_env(**env), "PYTHONPATH": str(FAKE)}
    plain = _run(tmp / "plain", program, [sys.executable, "app.py"], plain_env)
    rec = _run(tmp / "rec", program, [sys.executable, "-m", "tracekit", "record", "-o", "t.parquet", *opts,
                                      "app.py"], _env(**env))
    return plain, rec


def same(plain: subprocess.CompletedProcess[str], rec: subprocess.CompletedProcess[str]) -> None:
    assert (rec.returncode, rec.stdout, own_lines(rec.stderr)) == (plain.returncode, plain.stdout,
                                                                    plain.stderr), rec.stderr


def mallocs(trace: Path) -> list[int]:
    t = read_trace(trace, strict=True)
    return t.events.size[t.events.op == Op.MALLOC].tolist()


CUPY_NAMES = """
    import cupy
    import cupy.cuda.memory as memory

    def check(where):
        for name, (cls, size) in memory.COMPILED_AGAINST.items():
            for owner in (memory, cupy.cuda):
                if hasattr(owner, name):
                    assert getattr(owner, name) is cls, (where, owner.__name__, name)
            assert "__pyx_vtable__" in cls.__dict__ and cls.__basicsize__ == size, name

    check("start")
    w = cupy.linalg.eigh(4096)  # imports the compiled solver module now, as CuPy does
    check("after eigh")
    print("workspace", w.mem.size, type(w).__name__)
"""


def test_cupys_names_stay_its_own_types_and_a_lazily_imported_compiled_module_loads(tmp_path: Path) -> None:
    plain, rec = both(tmp_path, CUPY_NAMES)
    same(plain, rec)
    assert rec.returncode == 0 and rec.stdout == "workspace 4096 MemoryPointer\n"
    assert mallocs(tmp_path / "rec" / "t.parquet") == [4096]


POOLS = """
    import threading
    import cupy

    class Counted(cupy.cuda.MemoryHook):  # the program's own hook, as a witness
        name = "counted"
        def __init__(self):
            self.n = 0
        def malloc_postprocess(self, **kw):
            self.n += 1

    class Mine(cupy.cuda.MemoryPool):  # a pool class of the program's own
        def malloc(self, size):
            self.asked = getattr(self, "asked", 0) + 1
            return super().malloc(size)

    hook = Counted()
    hook.__enter__()
    mine = Mine()
    cupy.cuda.set_allocator(mine.malloc)
    a = [cupy.empty(3 * KiB) for _ in range(3)]
    assert cupy.cuda.get_allocator() == mine.malloc
    fast = cupy.cuda.MemoryAsyncPool()
    cupy.cuda.set_allocator(fast.malloc)
    assert cupy.cuda.get_allocator() == fast.malloc
    b = cupy.empty(5 * KiB)
    del b

    def worker():
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc):
            c = [cupy.empty(7 * KiB) for _ in range(2)]
            del c
        pool.free_all_blocks()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    cupy.cuda.set_allocator(None)
    raw = cupy.empty(11 * KiB)  # no pool: not recorded, as without a hook
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    mine.free_all_blocks()
    print("hooked", hook.n, "asked", mine.asked, "raw", type(raw.mem).__name__)
""".replace("KiB", str(KiB))


@pytest.mark.parametrize("async_pools", [False, True], ids=["hook-only", "async-pools"])
def test_pools_of_the_programs_own_in_any_thread(tmp_path: Path, async_pools: bool) -> None:
    plain, rec = both(tmp_path, POOLS, *(["--async-pools"] if async_pools else []))
    same(plain, rec)
    assert rec.stdout == "hooked 3 asked 3 raw Memory\n"
    t = read_trace(tmp_path / "rec" / "t.parquet", strict=True)
    assert t.extras is not None
    pools = {e["id"]: (e["kind"], e["label"]) for e in t.meta.extra["pools"]}
    col = t.extras.column("pool").to_pylist()
    rows = [(Op(int(op)).label, int(size), pools[p]) for op, size, p in zip(t.events.op, t.events.size, col,
                                                                            strict=True)]
    user1, async1, user2 = ("pool", "user 1"), ("async", "async 1"), ("pool", "user 2")
    # free_all_blocks() releases no segment whose block is still in use
    assert [r for r in rows if r[2] == user1] == [("segment_alloc", 3 * KiB, user1),
                                                  ("malloc", 3 * KiB, user1)] * 3
    if async_pools:  # only --async-pools sees an async pool's requests (they fire no memory hook)
        assert [r[:2] for r in rows if r[2] == async1] == [("malloc", 5 * KiB), ("free", 5 * KiB)]
        assert "async_pools_unrecorded" not in t.meta.extra
    else:
        assert async1 not in pools.values() and t.meta.extra["async_pools_unrecorded"] is True
    assert [r[:2] for r in rows if r[2] == user2] == [
        ("segment_alloc", 7 * KiB), ("malloc", 7 * KiB), ("segment_alloc", 7 * KiB), ("malloc", 7 * KiB),
        ("free", 7 * KiB), ("free", 7 * KiB), ("segment_free", 7 * KiB), ("segment_free", 7 * KiB)]
    assert 11 * KiB not in t.events.size.tolist()


def test_a_program_that_changes_folder_keeps_its_trace(tmp_path: Path) -> None:
    program = """
        import os
        import cupy
        os.makedirs("elsewhere", exist_ok=True)
        os.chdir("elsewhere")
        a = cupy.empty(2048)
        print(os.path.basename(os.getcwd()))
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.returncode == 0 and "Wrote t.parquet" in rec.stderr
    assert mallocs(tmp_path / "rec" / "t.parquet") == [2048]
    assert not list((tmp_path / "rec" / "elsewhere").iterdir())


FORK = """
    import os
    import cupy
    a = cupy.empty(1000)
    pid = os.fork()
    if pid == 0:
        b = [cupy.empty(3000) for _ in range(4)]  # the child's: never in the parent's trace
        print("child", flush=True)
        raise SystemExit(5)  # ends through tracekit's epilogue, in the child's process
    _, status = os.waitpid(pid, 0)
    c = [cupy.empty(5000) for _ in range(2)]
    print("parent after the child's", os.waitstatus_to_exitcode(status))
"""


def test_a_forked_child_writes_nothing_and_the_parent_keeps_recording(tmp_path: Path) -> None:
    plain, rec = both(tmp_path, FORK)
    same(plain, rec)
    assert rec.stdout == "child\nparent after the child's 5\n" and rec.stderr.count("Wrote ") == 1
    out = tmp_path / "rec" / "t.parquet"
    t = read_trace(out, strict=True)
    assert mallocs(out) == [1000, 5000, 5000]  # the parent's, before and after the fork
    assert t.meta.extra["complete"] is True and t.meta.extra["exit"]["code"] == 0
    assert not (tmp_path / "rec" / "t.parquet.spool").exists()


@pytest.mark.parametrize("upto", [1024, 1 << 20])  # the low descriptors; every one (the watcher's pipe too)
def test_a_daemon_that_closes_every_descriptor_keeps_its_trace(tmp_path: Path, upto: int) -> None:
    program = f"""
        import os, time
        import cupy
        a = cupy.empty(1000)
        time.sleep(0.7)  # a flush happens before the descriptors go
        os.closerange(3, {upto})
        b = [cupy.empty(2000) for _ in range(3)]
        time.sleep(0.7)  # and one after
        print("done")
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    t = read_trace(tmp_path / "rec" / "t.parquet", strict=True)
    assert mallocs(tmp_path / "rec" / "t.parquet") == [1000, 2000, 2000, 2000]
    assert "spool_error" not in t.meta.extra and t.meta.extra["complete"] is True
    # the watcher heard the trace was written (through its pipe, high enough to survive the first
    # closerange, or through its mark where the pipe went too): it wrote no second trace beside
    # the first, said nothing, and left (it used to write one a moment after record returned)
    time.sleep(1.5)
    assert sorted(p.name for p in (tmp_path / "rec").glob("t*")) == ["t.parquet"]
    assert "wrote its own file" not in rec.stderr


def test_streams_set_to_none_keep_the_exit_code_and_the_trace(tmp_path: Path) -> None:
    program = """
        import sys
        import cupy
        print("before")
        sys.stdout = sys.stderr = None
        a = cupy.empty(4096)
        raise SystemExit(3)
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.returncode == 3 and "Wrote t.parquet" in rec.stderr
    assert mallocs(tmp_path / "rec" / "t.parquet") == [4096]


def test_closed_descriptors_1_and_2_keep_the_exit_code_and_the_trace(tmp_path: Path) -> None:
    program = """
        import os
        import cupy
        print("before", flush=True)
        os.close(1)
        os.close(2)
        a = cupy.empty(4096)
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.returncode == 0 and rec.stdout == "before\n"
    assert mallocs(tmp_path / "rec" / "t.parquet") == [4096]


def test_a_spool_on_a_full_disk_ends_with_spool_error_and_the_programs_exit_code(tmp_path: Path) -> None:
    """A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) stands for a full disk: the spool's next
    write fails with EFBIG; the program runs on and ends as it would, the trace says why it is short."""
    program = """
        import os, resource, signal, time
        import cupy
        a = cupy.empty(1000)
        time.sleep(0.7)
        spool = "t.parquet.spool"
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        if os.path.exists(spool):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(spool), hard))
        b = [cupy.empty(2000) for _ in range(3)]
        time.sleep(0.7)
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        print("done")
        raise SystemExit(4)
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.returncode == 4 and "Traceback" not in rec.stderr
    t = read_trace(tmp_path / "rec" / "t.parquet", strict=True)
    assert "File too large" in t.meta.extra["spool_error"]
    # what was spooled before the disk filled, and what the spool could not take from the shared ring
    # beside it (record.tail, made with its blocks before the program ran); without the compiled
    # helper there is no ring, and only what was spooled
    kept = [1000, 2000, 2000, 2000] if COMPILED else [1000]
    assert mallocs(tmp_path / "rec" / "t.parquet") == kept


def test_the_fatal_oom_without_a_recorded_site_takes_the_exceptions(tmp_path: Path) -> None:
    program = """
        import cupy

        def make(n):
            return cupy.empty(n)

        cupy.get_default_memory_pool().set_limit(size=4 << 20)
        keep = make(1 << 20)
        more = make(8 << 20)
    """
    plain, rec = both(tmp_path, program, "--no-sites")
    assert rec.returncode == plain.returncode == 1 and "OutOfMemoryError" in rec.stderr
    assert own_lines(rec.stderr).splitlines()[0] == "Traceback (most recent call last):"
    t = read_trace(tmp_path / "rec" / "t.parquet", strict=True)
    oom = int(np.flatnonzero(t.events.op == Op.OOM)[-1])
    assert t.meta.extra["exit"]["oom_seq"] == oom
    assert t.events.site_name(oom) == "app.py:5:make" == t.meta.extra["exit"]["site"]
    malloc = int(np.flatnonzero(t.events.op == Op.MALLOC)[0])
    assert t.events.site[malloc] == -1  # --no-sites: only the fatal OOM is named, from the exception



def test_the_recorder_loads_no_compiler_or_reader_into_the_program(tmp_path: Path) -> None:
    """numba (with its own LLVM), the trace reader and the report libraries load only after the
    program ended: a library of the program's that links LLVM itself (cuFFT's LTO callbacks,
    nvJitLink) never meets another copy in the same process."""
    program = """
        import sys
        import cupy
        heavy = ("numba", "llvmlite", "tracekit.trace.reader", "tracekit.record.recover", "matplotlib")
        print([m for m in heavy if m in sys.modules])
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.stdout == "[]\n"


def test_a_trace_that_cannot_be_written_is_said_in_one_sentence_and_the_exit_code_stays(
        tmp_path: Path) -> None:
    """The file size limit stays low to the end: the program's process cannot write the trace; its
    exit code stands, and the recorder's watcher (a process of its own, without that limit) writes
    the trace from the spool instead and removes the spool."""
    program = """
        import os, resource, signal, time
        import cupy
        a = cupy.empty(1000)
        time.sleep(0.7)
        if os.path.exists("t.parquet.spool"):
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
            resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize("t.parquet.spool"), hard))
        print("done")
        raise SystemExit(4)
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.returncode == 4 and "Traceback" not in rec.stderr, rec.stderr
    assert "Wrote t.parquet" in rec.stderr, rec.stderr
    assert (tmp_path / "rec" / "t.parquet").exists() and not (tmp_path / "rec" / "t.parquet.spool").exists()
    assert read_trace(tmp_path / "rec" / "t.parquet").meta.extra["finished_by"] == "watcher"


def test_a_forked_child_dies_of_sigterm_as_it_would_without_tracekit(tmp_path: Path) -> None:
    program = """
        import os, signal, time
        import cupy
        a = cupy.empty(1000)
        pid = os.fork()
        if pid == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """
    plain, rec = both(tmp_path, program)
    same(plain, rec)
    assert rec.stdout == f"child {-15}\n" and rec.returncode == 0


def test_an_error_through_a_recorded_function_shows_the_programs_own_traceback(tmp_path: Path) -> None:
    program = """
        import cupy
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc):
            cupy.cuda.set_allocator(pool.malloc)  # CuPy refuses: ValueError
    """
    plain, rec = both(tmp_path, program)
    assert rec.returncode == plain.returncode == 1
    ours = own_lines(rec.stderr).replace(str(tmp_path / "rec"), "<dir>")
    assert ours == plain.stderr.replace(str(tmp_path / "plain"), "<dir>") and "tracekit" not in ours
    assert "ValueError: Can't change the global allocator" in ours
