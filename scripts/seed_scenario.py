"""The seed's situation on one GPU: another process holds the memory, a kernel takes local memory.

    python -m tracekit record -o traces/cupy-seed.parquet scripts/seed_scenario.py

1. A helper child process (``seed_scenario.py hold GIB``) takes all but GIB
   (default 6) GiB of the device with one ``cudaMalloc`` and sleeps until its
   stdin closes.
2. This program fills 8 MiB of CuPy's pool.
3. It launches a kernel with 16 KiB of local memory per thread (a ``volatile``
   4096-float array indexed by thread, so it stays in local memory): the launch
   raises the device's stack limit to 16 KiB per thread and the driver
   reserves that for every thread the device can hold.
4. It asks for 512 MiB arrays until CuPy raises ``OutOfMemoryError``, reads
   ``cudaMemGetInfo`` right at the raise (written to ``--probe PATH`` as JSON
   with the stack limit and the helper's pid), stops the helper and re-raises:
   the program dies of that OOM.

``--cure`` applies one of the cures ``tracekit advise`` names, between step 3 and
step 4, and measures what it gives back (``cudaMemGetInfo`` free before and after,
in the probe's ``cure`` object):

- ``stack``: ``cupy.cuda.runtime.deviceSetLimit(cudaLimitStackSize, <the limit before
  the kernel>)`` after the kernel returned;
- ``other-process``: the helper is stopped (its stdin closed, waited for), then free
  is read until it stops rising (the driver frees a dead process's memory a moment
  after it exits);
- ``heap``: with ``--heap-mib``, the heap limit the program would raise is left as it
  was (the cure must come before the first kernel that calls ``malloc``); without the
  cure, the program also tries to lower the heap after that kernel and records the
  error the driver gives.

``--heap-mib N`` raises ``cudaLimitMallocHeapSize`` to N MiB and launches a kernel
that calls ``malloc`` (the launch reserves the heap); ``--no-local`` skips the
local-memory kernel. ``--max-arrays K`` stops after K arrays (0: until the OOM).

``seed_scenario.py torch-stack --probe PATH`` checks the PyTorch line: in a PyTorch
process, the same kernel (through CuPy, on PyTorch's primary context) raises the stack
limit, then ``ctypes.CDLL("libcuda.so.1").cuCtxSetLimit(0, ctypes.c_size_t(1024))``
lowers it; ``torch.cuda.mem_get_info`` before and after.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GiB, MiB = 1 << 30, 1 << 20
STACK, PRINTF, HEAP = 0, 1, 2  # cudaLimit values
KERNEL = r"""
extern "C" __global__ void local_heavy(const float* in, float* out, int n) {
    volatile float buf[4096];  // 16 KiB per thread, kept in local memory by volatile
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < 4096; ++i) buf[i] = in[(t + i) % n];
    out[t % n] = buf[(t * 7919) % 4096];
}
"""
MALLOC_KERNEL = r"""
extern "C" __global__ void heap_user(float* out) {
    float* p = (float*)malloc(64);  // any device-side malloc makes the launch reserve the heap
    if (p != 0) { p[0] = 1.0f; out[threadIdx.x] = p[0]; free(p); }
}
"""


def hold(keep_free_gib: float) -> None:
    import cupy as cp

    free, _ = cp.cuda.runtime.memGetInfo()
    ptr = cp.cuda.runtime.malloc(max(int(free - keep_free_gib * GiB), 0))
    print("ready", flush=True)
    sys.stdin.read()  # until the parent closes our stdin (or exits)
    cp.cuda.runtime.free(ptr)


def start_helper(keep_free_gib: float) -> subprocess.Popen[str]:
    helper = subprocess.Popen([sys.executable, __file__, "hold", str(keep_free_gib)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    line = helper.stdout.readline()
    if line.strip() != "ready":
        raise RuntimeError(f"the helper process did not take the memory ({line!r})")
    return helper


def stop_helper(helper: subprocess.Popen[str]) -> None:
    if helper.returncode is not None:
        return
    assert helper.stdin is not None
    helper.stdin.close()
    helper.wait(timeout=60)


def settled_free(rt: Any, before: int, timeout_s: float = 5.0) -> int:
    """cudaMemGetInfo free, read until it stops rising (two equal readings 50 ms apart) or the timeout."""
    last, end = before, time.monotonic() + timeout_s
    while time.monotonic() < end:
        time.sleep(0.05)
        now = int(rt.memGetInfo()[0])
        if now == last and now != before:
            return now
        last = now
    return last


def launch_heap_user(cp: Any, heap_mib: int, cure: str, report: dict[str, Any]) -> None:
    """Raise the heap limit (unless cured), launch a malloc kernel, try lowering it afterwards."""
    rt = cp.cuda.runtime
    heap0 = int(rt.deviceGetLimit(HEAP))
    if cure != "heap":
        rt.deviceSetLimit(HEAP, heap_mib * MiB)
    out = cp.zeros(256, cp.float32)
    free0 = int(rt.memGetInfo()[0])
    cp.RawKernel(MALLOC_KERNEL, "heap_user")((1,), (256,), (out,))
    cp.cuda.Device().synchronize()
    free1 = int(rt.memGetInfo()[0])
    report["heap"] = {"limit_before": heap0, "limit_at_launch": int(rt.deviceGetLimit(HEAP)),
                      "free_before_launch": free0, "free_after_launch": free1, "launch_took": free0 - free1}
    if cure != "heap":
        try:
            rt.deviceSetLimit(HEAP, heap0)
            report["heap"]["lower_after"] = "ok"
        except Exception as e:  # the H200 refuses: cudaErrorInvalidValue
            report["heap"]["lower_after"] = f"{type(e).__name__}: {e}"
        report["heap"]["limit_after_try"] = int(rt.deviceGetLimit(HEAP))


def apply_cure(cp: Any, cure: str, stack0: int, helper: subprocess.Popen[str] | None) -> dict[str, Any]:
    """The cure named, with cudaMemGetInfo free right before and after (bytes)."""
    rt = cp.cuda.runtime
    free0 = int(rt.memGetInfo()[0])
    if cure == "stack":
        rt.deviceSetLimit(STACK, stack0)
        free1 = int(rt.memGetInfo()[0])
    elif cure == "other-process" and helper is not None:
        stop_helper(helper)
        free1 = settled_free(rt, free0)
    else:
        return {}
    return {"name": cure, "free_before": free0, "free_after": free1, "returned": free1 - free0,
            "stack_after": int(rt.deviceGetLimit(STACK))}


def scenario(args: argparse.Namespace) -> None:
    import cupy as cp

    rt = cp.cuda.runtime
    report: dict[str, Any] = {"cure": {}, "argv": sys.argv[1:]}
    helper = start_helper(args.free_gib) if not args.no_helper else None
    try:
        time.sleep(0.5)  # NVML's process list catches up with the helper
        report["helper_pid"] = helper.pid if helper is not None else None
        filled = cp.ones(8 * MiB // 4, cp.float32)  # 8 MiB in the pool
        stack0 = int(rt.deviceGetLimit(STACK))
        report["stack_before"] = stack0
        if args.heap_mib:
            launch_heap_user(cp, args.heap_mib, args.cure, report)
        if not args.no_local:
            kernel = cp.RawKernel(KERNEL, "local_heavy")
            out = cp.zeros_like(filled)
            free0 = int(rt.memGetInfo()[0])
            kernel((1024,), (256,), (filled, out, cp.int32(filled.size)))
            cp.cuda.Device().synchronize()
            report["local_kernel"] = {"free_before": free0, "free_after": int(rt.memGetInfo()[0]),
                                      "stack_after": int(rt.deviceGetLimit(STACK)),
                                      "local_size_bytes": int(kernel.local_size_bytes)}
        report["cure"] = apply_cure(cp, args.cure, stack0, helper)
        report["free_before_arrays"] = int(rt.memGetInfo()[0])
        big = []
        try:
            while args.max_arrays == 0 or len(big) < args.max_arrays:
                big.append(cp.empty(512 * MiB, cp.uint8))
            report["arrays"] = len(big)
        except cp.cuda.memory.OutOfMemoryError:
            free, total = rt.memGetInfo()
            pool = cp.get_default_memory_pool()
            report.update({"mem_free": int(free), "mem_total": int(total), "arrays": len(big),
                           "stack_size": int(rt.deviceGetLimit(STACK)),
                           "pool_total": int(pool.total_bytes())})
            raise
        finally:
            if args.probe is not None:
                args.probe.write_text(json.dumps(report, indent=1))
    finally:
        if helper is not None:
            stop_helper(helper)


def torch_stack(probe: Path | None) -> None:
    """The PyTorch line for lowering the stack limit, measured (see the module docstring)."""
    import ctypes

    import cupy as cp
    import torch

    x = torch.ones(8 * MiB // 4, device="cuda")  # PyTorch owns the primary context from here
    libcuda = ctypes.CDLL("libcuda.so.1")

    def stack() -> int:
        v = ctypes.c_size_t()
        libcuda.cuCtxGetLimit(ctypes.byref(v), STACK)
        return int(v.value)

    stack0, free0 = stack(), int(torch.cuda.mem_get_info()[0])
    a = cp.asarray(x)
    out = cp.zeros_like(a)
    cp.RawKernel(KERNEL, "local_heavy")((1024,), (256,), (a, out, cp.int32(a.size)))
    torch.cuda.synchronize()
    stack1, free1 = stack(), int(torch.cuda.mem_get_info()[0])
    rc = libcuda.cuCtxSetLimit(0, ctypes.c_size_t(1024))  # the line advise gives for PyTorch
    stack2, free2 = stack(), int(torch.cuda.mem_get_info()[0])
    report = {"stack_before": stack0, "stack_after_kernel": stack1, "stack_after_cure": stack2,
              "free_before_kernel": free0, "free_after_kernel": free1, "free_after_cure": free2,
              "kernel_took": free0 - free1, "cure_returned": free2 - free1, "cuCtxSetLimit_rc": int(rc),
              "cupy_has_cudaLimitStackSize": hasattr(cp.cuda.runtime, "cudaLimitStackSize")}
    try:
        from cuda.bindings import runtime as crt  # cuda-python, where installed

        report["cuda_python"] = str(crt.cudaDeviceSetLimit(crt.cudaLimit.cudaLimitStackSize, 1024))
    except Exception as e:
        report["cuda_python"] = f"{type(e).__name__}: {e}"
    text = json.dumps(report, indent=1)
    print(text)
    if probe is not None:
        probe.write_text(text)


def main(argv: list[str]) -> int:
    if argv[:1] == ["hold"]:
        hold(float(argv[1]) if len(argv) > 1 else 6.0)
        return 0
    if argv[:1] == ["torch-stack"]:
        torch_stack(Path(argv[2]) if argv[1:2] == ["--probe"] and len(argv) > 2 else None)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", type=Path, default=None)
    ap.add_argument("--free-gib", type=float, default=6.0)
    ap.add_argument("--cure", choices=("none", "stack", "other-process", "heap"), default="none")
    ap.add_argument("--heap-mib", type=int, default=0)
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--no-helper", action="store_true")
    ap.add_argument("--max-arrays", type=int, default=0)
    scenario(ap.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
