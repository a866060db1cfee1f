"""The pytest plugin (``tracekit.pytest``), run in child pytest processes over the CuPy stand-in.

Each test writes a small test file into a fresh folder and runs ``python -m pytest -p
tracekit.pytest.plugin`` there with ``tests/fakecupy`` on the path (the entry point carries the
same name, so an installed plugin is not loaded twice): budgets over and under for each metric,
leaks with warm-ups, the table, the kept traces, an out-of-memory error, marker misuse, no CuPy,
start-up without CuPy and pytest-xdist.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from tracekit.pytest.plugin import parse_traces, trace_name
from tracekit.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"

HEAD = """
    import pytest
    import cupy

    MiB = 1 << 20


    def make(n):
        return [cupy.empty(MiB) for _ in range(n)]
"""


def _run(tmp: Path, body: str, *opts: str, fake: bool = True, name: str = "test_gpu.py",
         head: str = HEAD) -> subprocess.CompletedProcess[str]:
    (tmp / name).write_text(textwrap.dedent(head) + textwrap.dedent(body))
    path = f"{ROOT}{os.pathsep}{FAKE}" if fake else str(ROOT)
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "tracekit.pytest.plugin", "-p", "no:cacheprovider",
           "-q", "-rA", *opts]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp, env=env, timeout=180)


def _outcomes(p: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """test name -> PASSED/FAILED/SKIPPED/ERROR from the -rA summary."""
    out: dict[str, str] = {}
    for m in re.finditer(r"^(PASSED|FAILED|SKIPPED|ERROR) (?:\[\d+\] )?\S*?::(\w+)", p.stdout, re.M):
        out[m.group(2)] = m.group(1)
    for m in re.finditer(r"^SKIPPED \[\d+\] (\S+?):\d+: ", p.stdout, re.M):
        out.setdefault(m.group(1), "SKIPPED")
    return out


OVER_UNDER = """
    @pytest.mark.limit_gpu_memory("2 MiB", metric="reserved")
    def test_over():
        a = make(4)
        del a


    @pytest.mark.limit_gpu_memory("8 MiB", metric="reserved")
    def test_under():
        a = make(4)
        del a
"""


def test_over_budget_fails_with_the_message_and_under_passes(tmp_path: Path) -> None:
    p = _run(tmp_path, OVER_UNDER)
    assert _outcomes(p) == {"test_over": "FAILED", "test_under": "PASSED"}, p.stdout + p.stderr
    out = p.stdout
    assert ("GPU memory over budget: peak reserved 4.00 MiB on device 0 (cupy) > limit_gpu_memory 2.00 MiB"
            in out)
    assert "the user's line: test_gpu.py:9:make" in out  # the line in the test's own code
    assert "top stacks at the peak (live bytes):" in out and "4.00 MiB in 4 block(s)" in out
    assert "advise (--limit 2.00 MiB): " in out and "rerun with:" in out
    assert "Traceback" not in out  # one clear message, no traceback of the plugin


@pytest.mark.parametrize(("metric", "over"), [("reserved", "3 MiB"), ("allocated", "3 MiB"),
                                              ("device", "3 MiB")])
def test_each_metric(tmp_path: Path, metric: str, over: str) -> None:
    body = f"""
    @pytest.mark.limit_gpu_memory("{over}", metric="{metric}")
    def test_over():
        a = make(4)


    @pytest.mark.limit_gpu_memory("5 MiB", metric="{metric}")
    def test_under():
        a = make(4)
    """
    p = _run(tmp_path, body, "--gpu-memory-no-advise")
    assert _outcomes(p) == {"test_over": "FAILED", "test_under": "PASSED"}, p.stdout + p.stderr
    assert f"peak {metric} 4.00 MiB on device 0 (cupy) > limit_gpu_memory 3.00 MiB" in p.stdout
    assert "advise (" not in p.stdout


def test_allocated_peak_is_below_reserved_when_blocks_are_reused(tmp_path: Path) -> None:
    body = """
    @pytest.mark.limit_gpu_memory("3 MiB", metric="allocated")
    def test_reuse():
        for _ in range(5):
            a = make(2)
            del a
        b = make(3)
    """
    p = _run(tmp_path, body, "--gpu-memory")
    assert _outcomes(p) == {"test_reuse": "PASSED"}, p.stdout + p.stderr
    row = next(line for line in p.stdout.splitlines() if line.rstrip().endswith("::test_reuse"))
    assert row.split()[:4] == ["3.00", "MiB", "3.00", "MiB"]


LEAKS = """
    CACHE = []


    def lazily_cached():
        if not CACHE:  # a workspace made on the first call only, kept for later calls
            CACHE.append(make(2))
        return make(1)


    @pytest.mark.limit_gpu_leaks("1 MiB", warmups=0)
    def test_no_warmup():
        lazily_cached()


    @pytest.mark.limit_gpu_leaks("1 MiB", warmups=1)
    def test_warmed_up():
        lazily_cached()


    KEPT = []


    @pytest.mark.limit_gpu_leaks("1 MiB", warmups=2)
    def test_leaks_every_call():
        KEPT.append(make(2))
"""


def test_leaks_are_counted_after_warmups(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("")
    p = _run(tmp_path, LEAKS, "-p", "no:randomly")
    assert _outcomes(p) == {"test_no_warmup": "FAILED", "test_warmed_up": "PASSED",
                            "test_leaks_every_call": "FAILED"}, p.stdout + p.stderr
    assert ("GPU memory leaked: 2.00 MiB still live after the test (cupy, after 0 warm-up call(s)) "
            "> limit_gpu_leaks 1.00 MiB") in p.stdout
    assert "GPU memory leaked: 2.00 MiB still live after the test (cupy, after 2 warm-up call(s))" in p.stdout


def test_the_table_lists_the_highest_peaks(tmp_path: Path) -> None:
    body = """
    def test_small():
        a = make(1)


    def test_big():
        a = make(6)
        del a
        b = make(2)


    def test_none():
        pass
    """
    p = _run(tmp_path, body, "--gpu-memory", "--gpu-memory-top", "2")
    assert p.returncode == 0, p.stdout + p.stderr
    out = p.stdout
    assert "GPU memory (tracekit): highest peaks" in out
    lines = out[out.index("highest peaks"):].splitlines()
    assert lines[1].split() == ["peak", "reserved", "peak", "allocated", "device", "used", "library",
                                "device", "test"]
    assert lines[2].split() == ["6.00", "MiB", "6.00", "MiB", "6.00", "MiB", "cupy", "0",
                                "test_gpu.py::test_big"]
    assert lines[3].split()[-1] == "test_gpu.py::test_small" and lines[3].split()[:2] == ["1.00", "MiB"]
    assert "3 test(s) measured; 2 of 3 row(s) shown" in out


def test_the_junit_xml_carries_each_tests_measurement(tmp_path: Path) -> None:
    """CI reads the peaks from the JUnit XML: the property is on the test's own testcase, once."""
    import ast
    import xml.etree.ElementTree as ET

    body = """
    def test_big():
        a = make(3)
        del a
        b = make(1)


    def test_none():
        pass
    """
    p = _run(tmp_path, body, "--gpu-memory", "--junitxml=j.xml")
    assert p.returncode == 0, p.stdout + p.stderr
    got = {}
    for case in ET.parse(tmp_path / "j.xml").getroot().iter("testcase"):
        props = [q for q in case.iter("property") if q.get("name") == "tracekit_gpu_memory"]
        assert len(props) <= 1, ET.tostring(case)
        if props:
            got[case.get("name")] = ast.literal_eval(props[0].get("value") or "")
    (m,) = got["test_big"]["measurements"]
    (dev,) = m["devices"]
    assert m["backend"] == "cupy" and dev["reserved"] == 3 * (1 << 20) and dev["allocated"] == 3 * (1 << 20)


def test_nothing_is_printed_without_the_flag(tmp_path: Path) -> None:
    p = _run(tmp_path, "def test_a():\n    a = make(1)\n")
    assert p.returncode == 0 and "GPU memory" not in p.stdout, p.stdout


TRACES = """
    def test_fails():
        a = make(3)
        assert False


    def test_passes():
        a = make(2)
"""


def test_traces_are_kept_for_failures(tmp_path: Path) -> None:
    p = _run(tmp_path, TRACES, "--gpu-memory-traces", "kept")
    assert _outcomes(p) == {"test_fails": "FAILED", "test_passes": "PASSED"}, p.stdout + p.stderr
    assert sorted(x.name for x in (tmp_path / "kept").iterdir()) == ["test_gpu.py_test_fails.parquet"]
    t = read_trace(tmp_path / "kept" / "test_gpu.py_test_fails.parquet", strict=True)
    assert t.meta.extra["pytest"] == {"nodeid": "test_gpu.py::test_fails"}
    assert t.meta.extra["exit"]["exception"] == "AssertionError"
    assert int((t.events.op == 0).sum()) == 3
    a = subprocess.run([sys.executable, "-m", "tracekit", "analyze", "kept/test_gpu.py_test_fails.parquet"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert a.returncode == 0 and "peak live          3.00 MiB" in a.stdout, a.stdout + a.stderr


def test_traces_all_keeps_every_test(tmp_path: Path) -> None:
    p = _run(tmp_path, TRACES, "--gpu-memory-traces=kept=all")
    assert p.returncode == 1
    assert sorted(x.name for x in (tmp_path / "kept").iterdir()) == [
        "test_gpu.py_test_fails.parquet", "test_gpu.py_test_passes.parquet"]
    assert "GPU memory (tracekit): highest peaks" in p.stdout  # the traces option measures every test


def test_an_out_of_memory_error_is_the_tests_failure_with_the_diagnosis(tmp_path: Path) -> None:
    body = """
    def test_oom():
        pool = cupy.get_default_memory_pool()
        pool.set_limit(size=4 * MiB)
        try:
            make(8)
        finally:
            pool.set_limit(size=0)


    def test_after():
        a = make(1)
    """
    p = _run(tmp_path, body, "--gpu-memory-traces", "kept")
    assert _outcomes(p) == {"test_oom": "FAILED", "test_after": "PASSED"}, p.stdout + p.stderr
    out = p.stdout
    assert "E               tracekit: the GPU memory at this out-of-memory error" in out
    assert "out of memory on device 0: a request of 1.00 MiB (rounded to 1.00 MiB)" in out
    assert ("pool: 4.00 MiB in use of 4.00 MiB reserved, 0 bytes cached free in 0 block(s), limit 4.00 MiB"
            in out)
    assert "(tracekit analyze " in out
    t = read_trace(tmp_path / "kept" / "test_gpu.py_test_oom.parquet")
    assert int((t.events.op == 4).sum()) == 1 and t.meta.extra["exit"]["oom_seq"] is not None


MISUSE = """
    @pytest.mark.limit_gpu_memory("8 GiB")
    def test_no_metric():
        pass


    @pytest.mark.limit_gpu_memory("eight", metric="reserved")
    def test_bad_size():
        pass


    @pytest.mark.limit_gpu_leaks("1 MiB", warmups=-1)
    def test_bad_warmups():
        pass
"""


def test_marker_misuse_is_one_clear_error(tmp_path: Path) -> None:
    p = _run(tmp_path, MISUSE)
    assert _outcomes(p) == {"test_no_metric": "ERROR", "test_bad_size": "ERROR",
                            "test_bad_warmups": "ERROR"}, p.stdout + p.stderr
    out = p.stdout
    assert ('metric= is required and must be one of reserved, allocated, device ("peak" alone is ambiguous), '
            "got None") in out
    assert "@pytest.mark.limit_gpu_memory: invalid limit_gpu_memory size 'eight'" in out
    assert "warmups must be an int >= 0, got -1" in out
    assert "Traceback" not in out and "plugin.py" not in out


def test_without_cupy_marked_tests_skip_with_a_reason(tmp_path: Path) -> None:
    if importlib.util.find_spec("cupy") is not None or importlib.util.find_spec("torch") is not None:
        pytest.skip("a real CuPy or PyTorch is installed here: the no-library case cannot be run")
    body = """
    @pytest.mark.limit_gpu_memory("1 MiB", metric="reserved")
    def test_marked():
        pass


    def test_plain():
        pass
    """
    p = _run(tmp_path, body, "--gpu-memory", fake=False, head="import pytest\n")
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"SKIPPED \[1\] test_gpu.py:\d+: GPU memory budget not measurable: CuPy is not "
                     r"installed; PyTorch is not installed", p.stdout), p.stdout
    assert "1 passed, 1 skipped" in p.stdout
    assert "no GPU memory was measured" in p.stdout


def test_start_up_imports_no_gpu_library(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""
        import sys, time

        T0 = time.perf_counter()


        def pytest_sessionfinish(session):
            heavy = sorted(m for m in ("cupy", "torch", "numba", "numpy", "tracekit.record.hook")
                           if m in sys.modules)
            print("HEAVY", heavy)
    """))
    p = _run(tmp_path, "def test_plain():\n    pass\n", "-s", head="")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "HEAVY []" in p.stdout
    code = ("import time, pytest; t = time.perf_counter(); import tracekit.pytest.plugin; "
            "print(time.perf_counter() - t)")
    took = min(float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True).stdout)
               for _ in range(3))
    assert took < 0.2, took


def test_xdist_workers_record_their_own_tests(tmp_path: Path) -> None:
    if importlib.util.find_spec("xdist") is None:
        pytest.skip("pytest-xdist is not installed (pip install pytest-xdist, or the dev extra)")
    body = "".join(f"""

    def test_{i}():
        a = make({i})
    """ for i in range(1, 7)) + """

    @pytest.mark.limit_gpu_memory("2 MiB", metric="allocated")
    def test_over():
        a = make(3)
    """
    p = _run(tmp_path, body, "-n", "2", "--gpu-memory", "--gpu-memory-no-advise")
    out = p.stdout
    assert p.returncode == 1 and "1 failed, 6 passed" in out, out + p.stderr
    assert "peak allocated 3.00 MiB on device 0 (cupy) > limit_gpu_memory 2.00 MiB" in out
    table = out[out.index("highest peaks"):].splitlines()
    rows = {line.split()[-1]: line.split()[0] for line in table[2:9]}
    # each test's peak is its own, whichever worker ran it and whatever ran there before
    want = {f"test_gpu.py::test_{i}": f"{i}.00" for i in range(1, 7)}
    assert rows == {**want, "test_gpu.py::test_over": "3.00"}


def test_the_entry_point_is_declared() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"tracekit.pytest.plugin": "tracekit.pytest.plugin"}


def test_trace_names_and_the_traces_option() -> None:
    assert trace_name("tests/test_a.py::test_x[1-a b]") == "tests_test_a.py_test_x_1-a_b.parquet"
    long = trace_name("t.py::test_" + "x" * 400)
    assert len(long) < 150 and long.endswith(".parquet")
    assert parse_traces(None) == (None, False)
    assert parse_traces("d=all") == (Path("d").resolve(), True)
    assert parse_traces("d") == (Path("d").resolve(), False)
