"""How much device memory the CUDA driver keeps for streams, and that a replay keeps none of it.

Run on a GPU machine from the repository root (``PYTHONPATH=. python scripts/gpu_stream_memory.py``).
Prints, in bytes relative to the start: free memory after making 1 and 41 streams, after
destroying them (the driver keeps the memory for reuse), and after replaying
``traces/cupy-user-pool.parquet`` (10 streams) through CuPy's pool, uncapped and under 1 GiB.
"""

from __future__ import annotations

import gc

import cupy
from cupy.cuda import runtime as rt

from tracekit.device.replay import Allocator, DeviceConfig, replay_on_device
from tracekit.trace import read_trace


def free() -> int:
    rt.deviceSynchronize()
    return int(rt.memGetInfo()[0])


def main() -> None:
    s0 = free()
    one = cupy.cuda.Stream()
    print("1 stream made", free() - s0)
    many = [cupy.cuda.Stream() for _ in range(40)]
    print("41 streams made", free() - s0)
    del one, many
    gc.collect()
    print("41 streams destroyed", free() - s0)
    tr = read_trace("traces/cupy-user-pool.parquet")
    print("streams in the trace", len(set(tr.events.stream.tolist())))
    for alloc, cap in ((Allocator.CUPY, None), (Allocator.CUDA, 1 << 30), (Allocator.CUPY, 1 << 30)):
        s = free()
        run = replay_on_device(tr, DeviceConfig(0, alloc, cap))
        del run
        print(f"replay {alloc.value} capacity {cap}", free() - s)


if __name__ == "__main__":
    main()
