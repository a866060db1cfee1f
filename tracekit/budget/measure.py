"""Measure the cheap part of the device budget: NVML before the context, the context's cost, limits.

``cheap_budget(device)`` launches no kernel and allocates nothing: it reads
NVML (which creates no CUDA context), creates (or finds) this process's
context, reads ``cudaMemGetInfo``, the runtime limits and the device
properties, and returns a JSON-able dict (``shapes.CheapBudget``) whose keys are listed in
``BUDGET_KEYS`` (bytes unless named otherwise). ``None`` marks a figure the
driver would not give. The dict is what ``tracekit record`` stores in a
trace's metadata under ``"budget"``.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

from tracekit.budget.model import local_memory_model
from tracekit.budget.shapes import Budget, CheapBudget, FinalFigures, OtherProcess, PoolFigures, Probe
from tracekit.gpu.cuda import check_device, import_cupy
from tracekit.gpu.driver import LIMIT_CODES, primary_context_active
from tracekit.gpu.nvml import Nvml

SCHEMA = "tracekit.budget/1"

BUDGET_KEYS: dict[str, str] = {
    "schema": "format tag, 'tracekit.budget/1'",
    "device": "CUDA device ordinal measured",
    "name": "device name (NVML, else CUDA properties)",
    "pci_bus_id": "PCI bus id, used to find the same GPU in NVML",
    "driver_version": "NVML driver version string",
    "cuda_driver_version": "cudaDriverGetVersion (1000*major + 10*minor)",
    "cuda_runtime_version": "cudaRuntimeGetVersion",
    "nvml": "whether NVML answered",
    "context_existed": "this process held a context on the device before measuring (None: unknown)",
    "nvml_total": "board memory (NVML v2 total)",
    "nvml_reserved": "driver/firmware reservation, never usable by CUDA (NVML v2 reserved)",
    "nvml_used_before": "NVML v2 used before this process's context (other processes' memory)",
    "nvml_free_before": "NVML v2 free before this process's context",
    "nvml_used_v1_before": "NVML v1 used before the context (counts the reservation as used)",
    "other_processes": "list of {pid, bytes} NVML reports on the device (bytes None where hidden)",
    "other_processes_bytes": "in use before this context: other processes and driver state (NVML v2 used)",
    "cuda_total": "cudaMemGetInfo total (board memory minus the reservation)",
    "cuda_free": "cudaMemGetInfo free right after the context exists",
    "context_create_s": "seconds to create the context (0 when it existed)",
    "context_bytes": "this process's context cost: NVML free before - cudaMemGetInfo free after",
    "context_and_others_bytes": "cuda_total - cuda_free: context + other processes + own allocations",
    "nvml_used_after": "NVML v2 used after the context",
    "stack_size": "cudaLimitStackSize, bytes of call stack per thread",
    "printf_fifo_size": "cudaLimitPrintfFifoSize",
    "malloc_heap_size": "cudaLimitMallocHeapSize (device-side malloc heap)",
    "sm_count": "multiprocessors",
    "max_threads_per_sm": "maximum resident threads per multiprocessor",
    "local_memory_model_bytes": "stack_size * max_threads_per_sm * sm_count (local-memory estimate)",
    "cupy_pool_total_bytes": "bytes CuPy's default pool holds on the device (None: CuPy pool not in use)",
    "cupy_pool_used_bytes": "bytes of that pool in live arrays",
    "measured_at": "UTC time of the measurement, ISO 8601",
}


def _cupy() -> Any:
    return import_cupy("the budget needs a GPU")


def unmeasured_budget(device_id: int) -> CheapBudget:
    """Every figure unknown (None) but the format tag and the device; cudaMemGetInfo's three
    (0 here) are set before ``cheap_budget`` returns."""
    return CheapBudget(
        schema=SCHEMA, device=device_id, name=None, pci_bus_id=None, driver_version=None,
        cuda_driver_version=None, cuda_runtime_version=None, nvml=None, context_existed=None,
        nvml_total=None, nvml_reserved=None, nvml_used_before=None, nvml_free_before=None,
        nvml_used_v1_before=None, other_processes=[], other_processes_bytes=None, cuda_total=0,
        cuda_free=0, context_create_s=None, context_bytes=None, context_and_others_bytes=0,
        nvml_used_after=None, stack_size=None, printf_fifo_size=None, malloc_heap_size=None,
        sm_count=None, max_threads_per_sm=None, local_memory_model_bytes=None,
        cupy_pool_total_bytes=None, cupy_pool_used_bytes=None, measured_at=None,
    )


def cheap_budget(device_id: int) -> CheapBudget:
    """The budget without kernel launches or bisection; see BUDGET_KEYS for every key."""
    cp = _cupy()
    rt = cp.cuda.runtime
    check_device(rt, device_id)
    existed = primary_context_active(device_id)
    props = rt.getDeviceProperties(device_id)
    try:
        pci: str | None = rt.deviceGetPCIBusId(device_id)
    except Exception:
        pci = None
    out = unmeasured_budget(device_id)
    out["pci_bus_id"] = pci
    with Nvml() as nv:
        key: int | str = pci if pci else device_id
        out["nvml"] = nv.available
        out["driver_version"] = nv.driver_version()
        out["name"] = nv.name(key) or _decode(props.get("name"))
        before = nv.memory(key)
        procs = nv.processes(key) or []
        mine = os.getpid()
        if existed is None:  # no driver answer: fall back to our pid in NVML's list
            existed = any(pid == mine for pid, _ in procs) or None
        out["other_processes"] = [OtherProcess(pid=pid, bytes=b) for pid, b in procs if pid != mine]
        t0 = time.perf_counter()
        with cp.cuda.Device(device_id):
            free, total = rt.memGetInfo()
            out["context_create_s"] = 0.0 if existed else round(time.perf_counter() - t0, 6)
            out["stack_size"] = stack = int(rt.deviceGetLimit(LIMIT_CODES["stack_size"]))
            out["printf_fifo_size"] = int(rt.deviceGetLimit(LIMIT_CODES["printf_fifo_size"]))
            out["malloc_heap_size"] = int(rt.deviceGetLimit(LIMIT_CODES["malloc_heap_size"]))
        after = nv.memory(key)
    out["context_existed"] = existed
    out["cuda_total"], out["cuda_free"] = int(total), int(free)
    out["context_and_others_bytes"] = int(total - free)
    if before is not None:
        out["nvml_total"], out["nvml_reserved"] = before.total, before.reserved
        out["nvml_used_before"], out["nvml_free_before"] = before.used, before.free
        out["nvml_used_v1_before"] = before.used_v1
        if not existed:
            out["other_processes_bytes"] = before.used if before.reserved is not None else None
            out["context_bytes"] = int(before.free - free) if before.reserved is not None else None
    sizes = [b for pid, b in procs if pid != mine]
    if out["other_processes_bytes"] is None and sizes and all(b is not None for b in sizes):
        out["other_processes_bytes"] = sum(int(b or 0) for b in sizes)
    if after is not None:
        out["nvml_used_after"] = after.used
    out["cuda_driver_version"] = int(rt.driverGetVersion())
    out["cuda_runtime_version"] = int(rt.runtimeGetVersion())
    sms, threads = int(props["multiProcessorCount"]), int(props["maxThreadsPerMultiProcessor"])
    out["sm_count"], out["max_threads_per_sm"] = sms, threads
    out["local_memory_model_bytes"] = local_memory_model(stack, threads, sms)
    pool = _pool_figures(device_id)
    out["cupy_pool_total_bytes"] = pool["cupy_pool_total_bytes"]
    out["cupy_pool_used_bytes"] = pool["cupy_pool_used_bytes"]
    out["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    return out


def _pool_figures(device_id: int) -> PoolFigures:
    """What CuPy's default pool holds, only if this process already uses CuPy's pool."""
    if "cupy" not in sys.modules:
        return PoolFigures(cupy_pool_total_bytes=None, cupy_pool_used_bytes=None)
    import cupy

    pool = cupy.get_default_memory_pool()
    with cupy.cuda.Device(device_id):
        total, used = int(pool.total_bytes()), int(pool.used_bytes())
    return PoolFigures(cupy_pool_total_bytes=total, cupy_pool_used_bytes=used)


def _decode(v: Any) -> str | None:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    return None if v is None else str(v)


def free_now(device_id: int) -> tuple[int, int]:
    """cudaMemGetInfo (free, total) on ``device_id``."""
    cp = _cupy()
    with cp.cuda.Device(device_id):
        free, total = cp.cuda.runtime.memGetInfo()
    return int(free), int(total)


def measure_budget(device_id: int, kernel_local_bytes: int | None = None,
                   probe_largest: bool = False) -> Budget:
    """The full budget: ``cheap_budget`` plus the optional kernel and largest-block probes.

    Adds ``kernel_local`` (see ``tracekit.budget.kernel_probe``), ``probe``
    (``largest`` and ``granularity``, see ``tracekit.budget.probe``) and
    ``final`` (cudaMemGetInfo and pool figures after the probes, before any
    stack-limit restore, which is what the equation's ``free`` term uses).
    """
    from tracekit.budget.kernel_probe import probe_kernel_local
    from tracekit.budget.probe import granularity, largest_allocation

    b = Budget(**cheap_budget(device_id))
    if probe_largest:
        b["probe"] = Probe(largest=largest_allocation(device_id), granularity=granularity(device_id))
    if kernel_local_bytes is not None:
        kl = probe_kernel_local(device_id, kernel_local_bytes)
        b["kernel_local"] = kl
        free_final = kl["free_before"] - kl["kept_bytes"]
    else:
        free_final = free_now(device_id)[0]
    b["final"] = FinalFigures(cuda_free=free_final, **_pool_figures(device_id))
    return b
