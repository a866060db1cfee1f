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
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

GiB, MiB = 1 << 30, 1 << 20
KERNEL = r"""
extern "C" __global__ void local_heavy(const float* in, float* out, int n) {
    volatile float buf[4096];  // 16 KiB per thread, kept in local memory by volatile
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    for (int i = 0; i < 4096; ++i) buf[i] = in[(t + i) % n];
    out[t % n] = buf[(t * 7919) % 4096];
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


def scenario(probe: Path | None, keep_free_gib: float) -> None:
    import cupy as cp

    helper = start_helper(keep_free_gib)
    try:
        time.sleep(0.5)  # NVML's process list catches up with the helper
        filled = cp.ones(8 * MiB // 4, cp.float32)  # 8 MiB in the pool
        kernel = cp.RawKernel(KERNEL, "local_heavy")
        out = cp.zeros_like(filled)
        kernel((1024,), (256,), (filled, out, cp.int32(filled.size)))
        cp.cuda.Device().synchronize()
        big = []
        try:
            while True:
                big.append(cp.empty(512 * MiB, cp.uint8))
        except cp.cuda.memory.OutOfMemoryError:
            free, total = cp.cuda.runtime.memGetInfo()
            if probe is not None:
                probe.write_text(json.dumps({
                    "mem_free": int(free), "mem_total": int(total), "helper_pid": helper.pid,
                    "stack_size": int(cp.cuda.runtime.deviceGetLimit(0)), "arrays": len(big)}))
            raise
    finally:
        assert helper.stdin is not None
        helper.stdin.close()
        helper.wait(timeout=60)


def main(argv: list[str]) -> int:
    if argv[:1] == ["hold"]:
        hold(float(argv[1]) if len(argv) > 1 else 6.0)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--probe", type=Path, default=None)
    ap.add_argument("--free-gib", type=float, default=6.0)
    args = ap.parse_args(argv)
    scenario(args.probe, args.free_gib)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
