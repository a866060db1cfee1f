"""Nothing of CuPy's is replaced while recording, and the segments still end where CuPy ends them.

Over the CuPy stand-in (``tests/fakecupy``): a driver process snapshots every attribute of
``cupy``, ``cupy.cuda``, ``cupy.cuda.memory``, ``cupy.cuda.memory_hook`` and
``cupy.cuda.runtime``, starts a real ``CupyRecording``, allocates through every pool path, and
compares identity, ``__name__``, ``__qualname__`` and pickling by reference while recording and
after. Then whole ``tracekit record`` runs check the segment rows the recorder finds without
replacing ``_malloc``: the ends CuPy makes in ``free_all_blocks`` (the program's, and the retry
before an out-of-memory error) come before the next device allocation, and at the end of the run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_record_fake_cupy import _env, _record

from tracekit.trace import Op, read_trace

KiB = 1 << 10

DRIVER = """
    import json, pickle, sys, types
    import cupy, cupy.cuda, cupy.cuda.memory, cupy.cuda.memory_hook, cupy.cuda.runtime
    from tracekit.record.session import CupyRecording

    MODULES = [cupy, cupy.cuda, cupy.cuda.memory, cupy.cuda.memory_hook, cupy.cuda.runtime]

    def snapshot():
        return {m.__name__: dict(vars(m)) for m in MODULES}

    def pickles_to_itself(obj):
        if not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            return None
        try:
            return pickle.loads(pickle.dumps(obj)) is obj
        except Exception:
            return False

    def changed(before, where):
        out = []
        for m in MODULES:
            now, then = vars(m), before[m.__name__]
            for name in sorted(set(now) | set(then)):
                if name == "__builtins__" or name not in then:
                    continue  # a name the module itself adds later (a lazy import) is compared below
                if name not in now or now[name] is not then[name]:
                    out.append(f"{where}: {m.__name__}.{name} is another object")
                    continue
                obj = now[name]
                for attr in ("__name__", "__qualname__"):
                    if getattr(obj, attr, None) != getattr(then[name], attr, None):
                        out.append(f"{where}: {m.__name__}.{name}.{attr}")
                if pickles_to_itself(obj) is False:
                    out.append(f"{where}: {m.__name__}.{name} does not pickle to itself")
            for name in sorted(set(now) - set(then)):
                if not isinstance(now[name], types.ModuleType):
                    out.append(f"{where}: {m.__name__}.{name} was added")
        return out

    before = snapshot()
    rec = None if sys.argv[1] == "none" else CupyRecording(
        __import__("pathlib").Path("t.parquet"), command=["x"], async_pools=sys.argv[1] == "async")
    if rec is not None:
        rec.start()
    during = changed(before, "recording")
    a = cupy.empty(1000)
    user = cupy.cuda.MemoryPool()
    cupy.cuda.set_allocator(user.malloc)
    b = cupy.empty(5000)
    with cupy.cuda.using_allocator(cupy.cuda.MemoryPool().malloc):
        c = cupy.empty(7000)
    cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc)
    during += changed(before, "after allocating")
    if rec is not None:
        rec.stop({"code": 0})
    print(json.dumps({"during": during, "after": changed(before, "stopped")}))
"""


def _drive(tmp: Path, mode: str) -> dict[str, list[str]]:
    (tmp / "driver.py").write_text(textwrap.dedent(DRIVER))
    p = subprocess.run([sys.executable, "driver.py", mode], capture_output=True, text=True, cwd=tmp,
                       env=_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    out: dict[str, list[str]] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def test_no_attribute_of_cupy_changes_identity_name_or_pickling_while_recording(tmp_path: Path) -> None:
    # What the program's own set_allocator changes (the stand-in keeps CuPy's C-level global in the
    # module's namespace) changes alike without recording: the recorder adds nothing to it.
    plain = _drive(tmp_path, "none")
    assert plain["during"] == ["after allocating: cupy.cuda.memory._current_allocator is another object"]
    assert _drive(tmp_path, "plain") == plain


def test_async_pools_replaces_exactly_the_four_allocator_functions_and_puts_them_back(tmp_path: Path) -> None:
    out = _drive(tmp_path, "async")
    wrapped = {f"cupy.cuda.memory.{n}" for n in ("set_allocator", "get_allocator",
                                                  "_set_thread_local_allocator",
                                                  "_get_thread_local_allocator")}
    wrapped |= {"cupy.cuda.set_allocator", "cupy.cuda.get_allocator"}
    named = {line.split(": ", 1)[1].split(" ")[0] for line in out["during"]
             if line.startswith("recording:") and line.endswith("is another object")}
    assert named == wrapped
    assert out["after"] == _drive(tmp_path, "none")["after"]


def _segment_rows(trace: Path) -> list[tuple[str, int, str]]:
    t = read_trace(trace, strict=True)
    assert t.extras is not None
    label = {e["id"]: e["label"] for e in t.meta.extra["pools"]}
    pool = t.extras.column("pool").to_pylist()
    return [(Op(int(o)).label, int(s), label.get(p, "?")) for o, s, p in zip(t.events.op, t.events.size, pool,
                                                                            strict=True)]


@pytest.mark.parametrize("pool_expr", ["cupy.get_default_memory_pool()", "cupy.cuda.MemoryPool()"],
                         ids=["default", "programs-own"])
def test_a_free_all_blocks_of_the_program_ends_its_segments_before_the_next_device_allocation(
        tmp_path: Path, pool_expr: str) -> None:
    program = f"""
        import cupy
        pool = {pool_expr}
        cupy.cuda.set_allocator(pool.malloc)
        a = [cupy.empty(3 * KiB) for _ in range(3)]
        keep = a.pop()
        del a
        pool.free_all_blocks()  # CuPy fires no hook here
        b = cupy.empty(5 * KiB)
        print(pool.total_bytes())
    """.replace("KiB", str(KiB))
    p = _record(tmp_path, program, "-o", "t.parquet")
    assert p.returncode == 0 and p.stdout == f"{8 * KiB}\n", p.stderr
    rows = [r[:2] for r in _segment_rows(tmp_path / "t.parquet")]
    seg = [r for r in rows if r[0].startswith("segment")]
    assert seg == [("segment_alloc", 3 * KiB)] * 3 + [("segment_free", 3 * KiB)] * 2 + \
        [("segment_alloc", 5 * KiB)]
    # the two ends come after the frees that emptied their segments and before the new one
    assert rows.index(("segment_free", 3 * KiB)) > max(i for i, r in enumerate(rows) if r[0] == "free")


def test_the_retry_before_an_out_of_memory_error_ends_the_freed_segments_before_the_oom_row(
        tmp_path: Path) -> None:
    program = """
        import cupy
        pool = cupy.get_default_memory_pool()
        pool.set_limit(size=8 * KiB)
        a = cupy.empty(4 * KiB)
        del a  # cached: CuPy frees it while retrying the next request
        b = cupy.empty(6 * KiB)  # fits once the cached segment is gone
        try:
            c = cupy.empty(6 * KiB)  # does not fit: CuPy retries, then raises
        except cupy.cuda.memory.OutOfMemoryError:
            print("oom")
    """.replace("KiB", str(KiB))
    p = _record(tmp_path, program, "-o", "t.parquet")
    assert p.returncode == 0 and p.stdout == "oom\n", p.stderr
    rows = [r[:2] for r in _segment_rows(tmp_path / "t.parquet")]
    assert [r for r in rows if r[0] != "free"] == [
        ("segment_alloc", 4 * KiB), ("malloc", 4 * KiB),
        ("segment_free", 4 * KiB), ("segment_alloc", 6 * KiB), ("malloc", 6 * KiB),
        ("oom", 6 * KiB)]


def test_a_pool_the_program_drops_ends_its_segments_by_the_end_of_the_trace(tmp_path: Path) -> None:
    program = """
        import cupy
        pool = cupy.cuda.MemoryPool()
        with cupy.cuda.using_allocator(pool.malloc):
            a = [cupy.empty(2 * KiB) for _ in range(4)]
        del a, pool  # the pool dies: CuPy frees its four segments, no hook says so
        b = cupy.empty(KiB)
    """.replace("KiB", str(KiB))
    p = _record(tmp_path, program, "-o", "t.parquet")
    assert p.returncode == 0, p.stderr
    rows = _segment_rows(tmp_path / "t.parquet")
    user = [r[0] for r in rows if r[2] == "user 1" and r[0].startswith("segment")]
    assert user == ["segment_alloc"] * 4 + ["segment_free"] * 4
    t = read_trace(tmp_path / "t.parquet")
    assert "async_pools_unrecorded" not in t.meta.extra
