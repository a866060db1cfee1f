"""``tracekit record`` of a program that allocates through RMM, on the CPU.

RMM itself needs a GPU (``tests/gpu/test_record_rmm_gpu.py`` records real RMM programs); here a
stand-in ``rmm`` package in the program's folder follows the part of RMM's API the recorder reads
(``rmm.mr.get_log_filenames``, ``get_per_device_resource(d)``, a ``LoggingResourceAdaptor`` with
``flush()`` and ``get_file_name()``) and writes its log as
``logging_resource_adaptor`` does: the CSV header, then ``%t,%H:%M:%S.%f,action,pointer,size,stream``
lines, buffered until ``flush``. CuPy is the stand-in of ``tests/fakecupy``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tracekit.record.rmm import DAY_NS, RmmLogs, local_time_of_day_ns, read_rows, rmm_output
from tracekit.trace import Op, Source, read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"

STAND_IN = '''
"""A stand-in for RMM's logging API (the recorder's side of it only)."""
import os, threading, time

class _Logged:
    def __init__(self, name):
        self.name = os.path.abspath(name)
        self.f = open(self.name, "w", buffering=1 << 20)  # buffered: lines reach the file at flush
        self.f.write("Thread,Time,Action,Pointer,Size,Stream\\n")
        self.next = 0x7f0000000000

    def line(self, action, ptr, size):
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1e6) % 1000000:06d}"
        self.f.write(f"{threading.get_native_id()},{stamp},{action},{ptr},{size},0x0\\n")

    def allocate(self, size):
        ptr = self.next
        self.next += (size + 255) // 256 * 256
        self.line("allocate", hex(ptr), size)
        return ptr

    def flush(self):
        self.f.flush()

    def get_file_name(self):
        return self.name

_per_device = {}

def reinitialize(logging=False, log_file_name=None):
    base, ext = os.path.splitext(log_file_name or "rmm_log.csv")
    _per_device[0] = _Logged(base + ".dev0" + ext) if logging else object()
'''

MR = '''
from rmm import _per_device
from rmm import _Logged as LoggingResourceAdaptor

def get_log_filenames():
    return {d: getattr(r, "name", None) for d, r in _per_device.items()}

def get_per_device_resource(device):
    return _per_device[device]
'''


def _record(tmp: Path, program: str, *opts: str) -> subprocess.CompletedProcess[str]:
    pkg = tmp / "rmm"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(STAND_IN)
    (pkg / "mr.py").write_text(MR)
    (tmp / "app.py").write_text(textwrap.dedent(program))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "tracekit", "record", *opts, "app.py"], capture_output=True,
                          text=True, cwd=tmp, env=env, timeout=120)


LOGGING_PROGRAM = """
    import time
    import cupy, rmm
    import rmm.mr
    rmm.reinitialize(logging=True, log_file_name="mine.csv")
    r = rmm.mr.get_per_device_resource(0)
    a = r.allocate(1000)
    time.sleep(0.01)
    b = r.allocate(4096)
    r.line("free", hex(a), 1000)
    r.line("allocate failure", "(nil)", 1 << 40)
    raise MemoryError("std::bad_alloc: out_of_memory: RMM failure")
"""


def test_the_programs_own_rmm_log_is_the_trace(tmp_path: Path) -> None:
    done = _record(tmp_path, LOGGING_PROGRAM, "-o", "t.parquet")
    assert done.returncode == 1, done.stderr  # the program's own exit: its MemoryError
    assert "MemoryError" in done.stderr and "Traceback" in done.stderr  # python's own report of it
    assert "Wrote t.parquet" in done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    ev = trace.events
    assert trace.meta.source == Source.RMM  # replay/advise take RMM's pool for it
    assert ev.op.tolist() == [Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM]
    assert ev.size.tolist() == [1000, 4096, 1024, 1 << 40]
    assert ev.addr.tolist()[:3] == [0x7F0000000000, 0x7F0000000400, 0x7F0000000000]
    t = ev.t_ns.astype(np.int64)
    duration = int(trace.meta.extra["duration_ns"])
    assert t[0] >= 0 and np.all(np.diff(t) >= 0) and t[-1] <= duration + 10**6  # the recording's clock
    assert t[1] - t[0] >= 9 * 10**6  # the program's sleep between its two allocations
    info = trace.meta.extra["rmm_record"]
    assert info["logging"] == "program" and info["logs"] == ["mine.dev0.csv"] and info["rows"] == 4
    assert trace.meta.recorded.exit is not None and trace.meta.recorded.exit.oom_seq == 3  # the failure
    assert (tmp_path / "mine.dev0.csv").exists()  # the program's file stays as it left it
    assert trace.meta.command == "python app.py"


def test_rmm_without_logging_is_told(tmp_path: Path) -> None:
    program = """
        import cupy, rmm
        import rmm.mr
        rmm.reinitialize(logging=False)
        x = cupy.empty(10)
    """
    done = _record(tmp_path, program, "-o", "t.parquet")
    assert done.returncode == 0, done.stderr
    assert "`tracekit record --rmm` records them" in done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    assert trace.meta.source == Source.CUPY and trace.meta.extra["rmm_unlogged"] == [0]


def test_a_program_that_never_imports_rmm_gets_no_rmm_keys(tmp_path: Path) -> None:
    done = _record(tmp_path, "import cupy\nx = cupy.empty(10)\n", "-o", "t.parquet")
    assert done.returncode == 0, done.stderr
    extra = read_trace(tmp_path / "t.parquet").meta.extra
    assert not {"rmm_unlogged", "rmm_trace", "rmm_record", "rmm_error"} & set(extra)
    assert "rmm" not in done.stderr.lower()


def test_both_pools_and_rmm_give_two_traces(tmp_path: Path) -> None:
    program = """
        import cupy, rmm
        import rmm.mr
        x = cupy.empty(1000)  # CuPy's own pool
        rmm.reinitialize(logging=True, log_file_name="mine.csv")
        rmm.mr.get_per_device_resource(0).allocate(512)
    """
    done = _record(tmp_path, program, "-o", "t.parquet")
    assert done.returncode == 0, done.stderr
    assert "Wrote t.parquet" in done.stderr and "t.rmm.parquet" in done.stderr
    cupy_trace = read_trace(tmp_path / "t.parquet")
    assert cupy_trace.meta.source == Source.CUPY and cupy_trace.meta.extra["rmm_trace"] == "t.rmm.parquet"
    rmm_trace = read_trace(tmp_path / "t.rmm.parquet")
    assert rmm_trace.meta.source == Source.RMM and rmm_trace.events.size.tolist() == [512]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12+ has sys.monitoring")
def test_rmm_flag_before_python_3_12_is_one_sentence(tmp_path: Path) -> None:
    done = _record(tmp_path, "import cupy\n", "--rmm", "-o", "t.parquet")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "record --rmm needs Python 3.12 or later" in done.stderr
    assert not (tmp_path / "t.parquet").exists()


def test_rmm_flag_with_torch_is_refused(tmp_path: Path) -> None:
    done = _record(tmp_path, "pass\n", "--torch", "--rmm")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--rmm apply to CuPy recordings" in done.stderr


# -- the rows of several logs on the recording's clock ----------------------------------------------


def _log(path: Path, lines: list[str]) -> Path:
    path.write_text("Thread,Time,Action,Pointer,Size,Stream\n" + "".join(s + "\n" for s in lines))
    return path


def test_logs_of_two_devices_merge_by_time_each_keeping_its_order(tmp_path: Path) -> None:
    a = _log(tmp_path / "r.0.dev0.csv", ["1,10:00:00.000010,allocate,0x100,256,0",
                                          "1,10:00:00.000030,allocate,0x200,256,0",
                                          "2,10:00:00.000020,free,0x100,256,0"])  # a thread logged late
    b = _log(tmp_path / "r.0.dev1.csv", ["3,10:00:00.000025,allocate,0x900,512,0"])
    logs = RmmLogs()
    for p in (a, b):
        logs.add(str(p))
    start = 10 * 3600 * 10**9  # the recording started at 10:00:00 local time
    rows = read_rows(logs, start, by_recorder=True)
    assert rows is not None
    ev = rows.events
    # file order kept (the late free clamped to its row before), the other device's row by its time
    assert ev.addr.tolist() == [0x100, 0x900, 0x200, 0x100]
    assert ev.device.tolist() == [0, 1, 0, 0]
    assert ev.t_ns.tolist() == [10_000, 25_000, 30_000, 30_000]
    assert rows.thread.tolist() == [1, 3, 1, 2]
    assert rows.info["logging"] == "record --rmm" and rows.info["rows"] == 4


def test_a_run_across_midnight_stays_in_order(tmp_path: Path) -> None:
    log = _log(tmp_path / "r.csv", ["1,23:59:59.999000,allocate,0x100,256,0",
                                    "1,00:00:00.001000,free,0x100,256,0"])
    logs = RmmLogs()
    logs.add(str(log))
    rows = read_rows(logs, DAY_NS - 2_000_000, by_recorder=False)
    assert rows is not None and rows.events.t_ns.tolist() == [1_000_000, 3_000_000]


def test_no_log_file_is_no_rows(tmp_path: Path) -> None:
    logs = RmmLogs()
    logs.add(str(tmp_path / "gone.csv"))
    assert read_rows(logs, 0, by_recorder=False) is None


def test_time_of_day_and_the_beside_name() -> None:
    assert 0 <= local_time_of_day_ns(1_700_000_000_123_456_789) < DAY_NS
    assert local_time_of_day_ns(1_700_000_000_123_456_789) % 10**9 == 123_456_789
    assert rmm_output(Path("/x/run.parquet")) == Path("/x/run.rmm.parquet")
    assert rmm_output(Path("/x/run")) == Path("/x/run.rmm.parquet")
