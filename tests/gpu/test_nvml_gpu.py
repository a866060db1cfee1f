"""On a GPU: ``tracekit.gpu.nvml`` (through nvidia-ml-py) reads the bytes a direct ctypes call reads.

The witness is NVML's C API called here over ctypes with the structures of ``nvml.h``
(``nvmlMemory_v2_t``, ``nvmlProcessInfo_t`` of ``GetComputeRunningProcesses_v3``), so a change
of binding cannot change the ``reserved`` term of the budget or a process's bytes unseen.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from tracekit.gpu.nvml import Nvml

pytestmark = pytest.mark.gpu


class MemoryV2(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("total", ctypes.c_ulonglong), ("reserved", ctypes.c_ulonglong),
                ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


def direct(index: int) -> tuple[MemoryV2, dict[int, int]]:
    lib = ctypes.CDLL("libnvidia-ml.so.1")
    assert lib.nvmlInit_v2() == 0
    try:
        h = ctypes.c_void_p()
        assert lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(h)) == 0
        m = MemoryV2()
        m.version = ctypes.sizeof(MemoryV2) | (2 << 24)
        assert lib.nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(m)) == 0
        count, buf = ctypes.c_uint(64), (ProcessInfo * 64)()
        assert lib.nvmlDeviceGetComputeRunningProcesses_v3(h, ctypes.byref(count), buf) == 0
        return m, {int(p.pid): int(p.usedGpuMemory) for p in buf[: count.value]}
    finally:
        lib.nvmlShutdown()


def test_memory_figures_equal_the_c_api() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is the 'gpu' extra")
    with Nvml() as nv:
        assert nv.available
        ours = nv.memory(0)
    raw, _ = direct(0)
    assert ours is not None
    assert (ours.total, ours.reserved) == (raw.total, raw.reserved)
    assert ours.total == ours.reserved + ours.used + ours.free
    assert abs(ours.free - raw.free) <= 64 << 20  # another process may allocate between the two reads


def test_a_process_holding_memory_is_listed_with_its_bytes() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is the 'gpu' extra")
    code = ("import cupy, sys; a = cupy.empty(256 << 20, cupy.uint8); cupy.cuda.Device().synchronize();"
            "print('ready', flush=True); sys.stdin.read()")
    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with Nvml() as nv:
            ours = dict(nv.processes(0) or [])
        _, raw = direct(0)
        assert child.pid in ours and ours[child.pid] == raw[child.pid]
        assert ours[child.pid] is not None and ours[child.pid] >= 256 << 20
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()
