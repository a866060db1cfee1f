"""Metadata a CuPy recording stores at start: device, memory, limits, versions, budget.

The cheap device budget (``tracekit.budget.cheap_budget``: NVML before the
context, the context's cost, the runtime limits) is measured first, before
this process touches the device, and stored whole under ``"budget"``; the
top-level keys repeat the figures the analyzer reads most (``nvml``,
``device_limits``). Every figure the driver will not give is ``None``, and a
budget that cannot be measured is stored as ``{"error": ...}`` rather than
stopping the recording. ``environment`` (``environment_meta``) holds the folders the
interpreter says are not the user's code, as ``record --torch`` stores them too.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

from tracekit import __version__
from tracekit.budget.shapes import CheapBudget
from tracekit.gpu.driver import LIMIT_CODES
from tracekit.trace.schema import DeviceInfo, Environment, Source, TraceMeta


def measure_budget(device_id: int) -> CheapBudget | str:
    """The cheap budget, or why it could not be measured (one line)."""
    try:
        from tracekit.budget import cheap_budget

        return cheap_budget(device_id)
    except Exception as e:  # budget code missing or the driver refused: the recording goes on
        return f"{type(e).__name__}: {e}"


def rerun_meta(command: list[str], limit: int | None) -> dict[str, Any]:
    """How ``advise --rerun`` runs the program again: its arguments as ``record`` got them, whether
    they name a module, the folder it started in, and the ``--limit`` it was recorded under."""
    module = len(command) > 1 and command[1] == "-m"
    return {"argv": command[2:] if module else command[1:], "module": module, "cwd": os.getcwd(),
            "limit_bytes": limit}


def environment_meta(roots: tuple[str, ...], packages: tuple[str, ...]) -> Environment:
    """The trace's ``environment`` key: what this interpreter says is not the user's code
    (``callstacks.environment_now``, which the recorder's kinds read too, so the two agree), with the
    user's folders among ``roots`` (``sites.site_roots``: the working directory, the program's folder).
    ``packages``: the array library's top-level packages. Shared by CuPy's recording (``start_meta``)
    and ``record --torch``."""
    from tracekit.record.callstacks import environment_now

    return environment_now(roots, packages)


def start_meta(cupy: Any, device_id: int, *, command: list[str], sites: bool, limit: int | None,
               pool: Any, budget: CheapBudget | str, stack_depth: int = 0) -> TraceMeta:
    """The trace metadata at start (call with ``device_id`` current and the recorded pool installed)."""
    rt = cupy.cuda.runtime
    free, total = (int(x) for x in rt.memGetInfo())
    props = rt.getDeviceProperties(device_id)
    name = props.get("name")
    name = name.decode(errors="replace") if isinstance(name, bytes) else str(name)
    measured = None if isinstance(budget, str) else budget
    limits = device_limits(rt, measured)
    pool_limit = int(pool.get_limit())
    versions = {
        "cupy": str(cupy.__version__),
        "cuda_runtime": _cuda_version(rt.runtimeGetVersion()),
        "cuda_driver": _cuda_version(rt.driverGetVersion()),
        "python": platform.python_version(),
        "tracekit": __version__,
    }
    if measured is not None and measured["driver_version"]:
        versions["nvidia_driver"] = str(measured["driver_version"])
    from tracekit.record.callstacks import CUPY_PACKAGES
    from tracekit.record.sites import site_roots

    module = len(command) > 1 and command[1] == "-m"
    program = command[1] if len(command) > 1 and not module else None  # as record_cupy's site roots

    return TraceMeta.new(
        Source.CUPY,
        device=DeviceInfo(name=name, total_bytes=total, free_bytes=free),
        pool_limit_bytes=pool_limit or None,
        command=" ".join(command),
        versions=versions,
        environment=environment_meta(site_roots(program), CUPY_PACKAGES),
    ).with_extra(
        argv=list(command),
        rerun=rerun_meta(command, limit),
        device_id=device_id,
        device_count=int(rt.getDeviceCount()),
        nvml=_nvml(measured) if measured is not None and measured["nvml"] else None,
        device_limits=limits,
        pool_limit_requested=limit,
        budget={"error": budget} if isinstance(budget, str) else budget,
        recorder={
            "call_sites": sites,
            "stack_depth": stack_depth if sites else 0,  # frames per stack; 0: no whole stacks
            "hook": "cupy.cuda.MemoryHook (malloc/free) + PythonFunctionAllocator (segments) "
                    "for every MemoryPool; MemoryAsyncPool.malloc wrapped",
            "threads": "every threading.Thread started after recording began",
            "pid": os.getpid(),
            "host": platform.node(),
        },
        start_unix_ns=time.time_ns(),
        executable=sys.executable,
    )


def _nvml(b: CheapBudget) -> dict[str, int | None]:
    """The NVML figures the analyzer reads at the top of the metadata."""
    return {"nvml_total": b["nvml_total"], "nvml_reserved": b["nvml_reserved"],
            "nvml_used_before": b["nvml_used_before"], "nvml_used_after": b["nvml_used_after"],
            "nvml_free_before": b["nvml_free_before"]}


def device_limits(rt: Any, budget: CheapBudget | None) -> dict[str, int | None]:
    """cudaLimit values: those the budget measured, else read now (the budget failed); None if refused."""
    measured: dict[str, int | None] = {} if budget is None else {
        "stack_size": budget["stack_size"], "printf_fifo_size": budget["printf_fifo_size"],
        "malloc_heap_size": budget["malloc_heap_size"]}
    limits: dict[str, int | None] = {}
    for key, code in LIMIT_CODES.items():
        if measured.get(key) is not None:
            limits[key] = measured[key]
            continue
        try:
            limits[key] = int(rt.deviceGetLimit(code))
        except Exception:
            limits[key] = None
    return limits


def _cuda_version(v: int) -> str:
    v = int(v)
    return f"{v // 1000}.{(v % 1000) // 10}"
