"""``record --rmm`` on the CPU: how RMM's calls are seen (``sys.monitoring``, Python 3.12+).

RMM needs a GPU (``tests/gpu/test_record_rmm_gpu.py`` records real programs on it). Here a stand-in
``rmm`` package in the program's folder has RMM's shape where the recorder depends on it: a Python
``rmm.reinitialize`` calling a compiled initializer; ``set_per_device_resource``,
``set_current_device_resource``, ``enable_logging`` and ``get_log_filenames`` compiled callables
(``functools.partial`` objects: like RMM's Cython functions they are not Python functions, so a
call of one fires ``C_RETURN``, and what they call inside is invisible as RMM's C calls are);
adaptors with ``get_upstream()``; a ``LoggingResourceAdaptor`` that writes RMM's CSV with
``.dev<N>`` of the current device, buffered until ``flush``. Skipped before Python 3.12 (no
``sys.monitoring``; ``test_record_rmm.py`` checks the one sentence ``--rmm`` then gives).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracekit.trace import Op, Source, read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"

pytestmark = pytest.mark.skipif(sys.version_info < (3, 12), reason="record --rmm needs Python 3.12+ "
                                "(sys.monitoring); this interpreter is older")

INIT = """
from rmm import mr
from rmm.mr import disable_logging, enable_logging, get_log_filenames
from rmm.rmm import reinitialize
"""

RMM_PY = """
from rmm.mr import _initialize

_hooks = []


def reinitialize(pool_allocator=False, managed_memory=False, initial_pool_size=None,
                 maximum_pool_size=None, devices=0, logging=False, log_file_name=None):
    for func in reversed(_hooks):
        func()
    _initialize(pool_allocator=pool_allocator, initial_pool_size=initial_pool_size,
                logging=logging, log_file_name=log_file_name)
"""

MR_PY = '''
import functools, os, threading, time

_per_device = {}
_device = [0]


def getDevice():
    return _device[0]


class DeviceMemoryResource:
    pass


class CudaMemoryResource(DeviceMemoryResource):
    _next = [0x7F0000000000]

    def allocate(self, size):
        ptr = self._next[0]
        self._next[0] += (size + 255) // 256 * 256
        return ptr

    def deallocate(self, ptr, size):
        pass


class UpstreamResourceAdaptor(DeviceMemoryResource):
    def __init__(self, upstream):
        self._up = upstream

    def get_upstream(self):
        return self._up

    def allocate(self, size):
        return self._up.allocate(size)

    def deallocate(self, ptr, size):
        self._up.deallocate(ptr, size)


class PoolMemoryResource(UpstreamResourceAdaptor):
    def __init__(self, upstream, initial_pool_size=None):
        super().__init__(upstream)
        self._size = 1 << 30 if initial_pool_size is None else initial_pool_size  # "half the free"

    def pool_size(self):
        return self._size


class StatisticsResourceAdaptor(UpstreamResourceAdaptor):
    count = 0

    def allocate(self, size):
        self.count += 1
        return self._up.allocate(size)


class LoggingResourceAdaptor(UpstreamResourceAdaptor):
    def __init__(self, upstream, log_file_name=None):
        super().__init__(upstream)
        base, ext = os.path.splitext(log_file_name)
        self._name = os.path.abspath(f"{base}.dev{getDevice()}{ext}")
        self._f = open(self._name, "w", buffering=1 << 20)
        self._f.write("Thread,Time,Action,Pointer,Size,Stream\\n")

    def _line(self, action, ptr, size):
        now = time.time()
        stamp = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now * 1e6) % 1000000:06d}"
        self._f.write(f"{threading.get_native_id()},{stamp},{action},{hex(ptr)},{size},0x0\\n")

    def allocate(self, size):
        ptr = self._up.allocate(size)
        self._line("allocate", ptr, size)
        return ptr

    def deallocate(self, ptr, size):
        self._line("free", ptr, size)
        self._up.deallocate(ptr, size)

    def flush(self):
        self._f.flush()

    def get_file_name(self):
        return self._name


def _set(device, resource):
    _per_device[device] = resource


def _init(pool_allocator=False, initial_pool_size=None, logging=False, log_file_name=None):
    _per_device.clear()
    r = PoolMemoryResource(CudaMemoryResource(), initial_pool_size) if pool_allocator \
        else CudaMemoryResource()
    _set(0, LoggingResourceAdaptor(r, log_file_name) if logging else r)


def _names():
    return {d: r.get_file_name() if isinstance(r, LoggingResourceAdaptor) else None
            for d, r in _per_device.items()}


def _enable(log_file_name=None):
    for d in list(_per_device) or [0]:
        if not isinstance(_per_device[d], LoggingResourceAdaptor):
            _set(d, LoggingResourceAdaptor(_per_device[d], log_file_name))


# compiled in RMM: here callables that are not Python functions
_initialize = functools.partial(_init)
set_per_device_resource = functools.partial(_set)
set_current_device_resource = functools.partial(lambda r: _set(getDevice(), r))
get_per_device_resource = functools.partial(lambda d: _per_device[d])
get_current_device_resource = functools.partial(lambda: _per_device[getDevice()])
get_log_filenames = functools.partial(_names)
enable_logging = functools.partial(_enable)
disable_logging = functools.partial(lambda: None)
_init()  # RMM sets a plain resource for device 0 when imported
'''


def _record(tmp: Path, program: str) -> subprocess.CompletedProcess[str]:
    pkg = tmp / "rmm"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text(INIT)
    (pkg / "rmm.py").write_text(RMM_PY)
    (pkg / "mr.py").write_text(MR_PY)
    (tmp / "app.py").write_text(textwrap.dedent(program))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "tracekit", "record", "--rmm", "-o", "t.parquet", "app.py"],
                          capture_output=True, text=True, cwd=tmp, env=env, timeout=120)


ALLOCATE = """
    def work(n, sizes=(1000, 4096, 300, 70000)):
        r = rmm.mr.get_current_device_resource()
        ptrs = [(r.allocate(s), s) for s in sizes[:n]]
        for p, s in ptrs[::2]:
            r.deallocate(p, s)
        return ptrs
"""


def test_reinitialize_called_with_kwargs_is_seen(tmp_path: Path) -> None:
    program = "import cupy, rmm\nimport rmm.mr\n" + textwrap.dedent(ALLOCATE) + textwrap.dedent("""
        cfg = {"pool_allocator": True}
        rmm.reinitialize(**cfg)  # a call that fires no CALL event for reinitialize itself on 3.12
        work(4)
        work(2)
    """)
    done = _record(tmp_path, program)
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    ev = trace.events
    assert trace.meta.source == Source.RMM
    assert ev.op.tolist() == [Op.MALLOC] * 4 + [Op.FREE] * 2 + [Op.MALLOC] * 2 + [Op.FREE]
    assert ev.size.tolist()[:4] == [1000, 4096, 300, 70000]
    assert trace.meta.extra["rmm_record"]["logging"] == "record --rmm"
    assert trace.meta.extra["rmm_record"]["enable_errors"] == []
    assert not list(tmp_path.glob("*.csv")), "the recorder's own logs are left behind"
    # the pool as the program set it up: RMM's default initial size measured, no maximum
    assert trace.meta.recorded.rmm_pool.initial_bytes == 1 << 30
    assert trace.meta.recorded.rmm_pool.maximum_bytes is None and trace.meta.pool_limit_bytes is None


def test_the_programs_pool_settings_are_in_the_trace(tmp_path: Path) -> None:
    program = "import cupy, rmm\nimport rmm.mr\n" + textwrap.dedent(ALLOCATE) + textwrap.dedent("""
        rmm.reinitialize(pool_allocator=True, initial_pool_size=1 << 20, maximum_pool_size="64MiB")
        work(4)
    """)
    done = _record(tmp_path, program)
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    pool = trace.meta.extra["rmm_record"]["pool"]
    assert pool["initial_pool_size"] == 1 << 20 and pool["maximum_pool_size"] == "64MiB"
    assert trace.meta.recorded.rmm_pool.initial_bytes == 1 << 20
    assert trace.meta.pool_limit_bytes == 64 << 20  # replay's and advise's default capacity


def test_a_resource_over_a_logged_one_is_not_logged_twice(tmp_path: Path) -> None:
    program = "import cupy, rmm\nimport rmm.mr\n" + textwrap.dedent(ALLOCATE) + textwrap.dedent("""
        rmm.reinitialize(pool_allocator=True)
        stats = rmm.mr.StatisticsResourceAdaptor(rmm.mr.get_current_device_resource())
        rmm.mr.set_current_device_resource(stats)
        work(4)
        assert stats.count == 4
    """)
    done = _record(tmp_path, program)
    assert done.returncode == 0, done.stderr
    ev = read_trace(tmp_path / "t.parquet").events
    assert int((ev.op == Op.MALLOC).sum()) == 4 and len(ev) == 6


def test_a_resource_set_directly_is_logged_from_then_on(tmp_path: Path) -> None:
    program = "import cupy, rmm\nimport rmm.mr\n" + textwrap.dedent(ALLOCATE) + textwrap.dedent("""
        work(2)  # on the plain resource RMM set at import: logged too
        pool = rmm.mr.PoolMemoryResource(rmm.mr.CudaMemoryResource(), 0)
        rmm.mr.set_current_device_resource(pool)
        work(3)
        assert rmm.mr.get_current_device_resource().get_upstream() is pool  # what --rmm changes
    """)
    done = _record(tmp_path, program)
    assert done.returncode == 0, done.stderr
    trace = read_trace(tmp_path / "t.parquet")
    assert int((trace.events.op == Op.MALLOC).sum()) == 5
    assert len(trace.meta.extra["rmm_record"]["logs"]) == 2  # one log per resource the program set


def test_the_programs_own_enable_logging_still_makes_its_log(tmp_path: Path) -> None:
    program = "import cupy, rmm\nimport rmm.mr\n" + textwrap.dedent(ALLOCATE) + textwrap.dedent("""
        rmm.reinitialize(pool_allocator=True)
        work(2)
        rmm.mr.enable_logging("mine.csv")
        work(3)
        assert rmm.mr.get_log_filenames()[0].endswith("mine.dev0.csv")
    """)
    done = _record(tmp_path, program)
    assert done.returncode == 0, done.stderr
    ev = read_trace(tmp_path / "t.parquet").events
    assert int((ev.op == Op.MALLOC).sum()) == 5  # ours before, the program's own after: each once
    mine = (tmp_path / "mine.dev0.csv").read_text().splitlines()
    assert len([x for x in mine if ",allocate," in x]) == 3  # the program's file has its lines
    assert [p.name for p in tmp_path.glob("*.csv")] == ["mine.dev0.csv"]


def test_a_program_that_never_imports_rmm_runs_as_without(tmp_path: Path) -> None:
    done = _record(tmp_path, "import cupy\nx = cupy.empty(100)\nprint(sum(range(10)))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "45\n"
    assert read_trace(tmp_path / "t.parquet").meta.source == Source.CUPY
