"""CuPy programs with their own pools, recorded for the committed traces and the recorder's GPU tests.

    python -m tracekit record -o traces/cupy-user-pool.parquet scripts/pool_workloads.py user_pool
    python -m tracekit record -o traces/cupy-async.parquet scripts/pool_workloads.py async

user_pool: like CuPy's examples/stream/map_reduce.py: the program makes its own
``MemoryPool``, installs it with ``cupy.cuda.set_allocator(pool.malloc)``, maps
random matrix products over eight streams and reduces them on another.
async: a ``MemoryAsyncPool`` installed as the allocator, arrays of varying size
made and dropped on two streams.
pool_threads: each of three threads makes its own pool and allocates from it
under ``cupy.cuda.using_allocator``.
oom_probe: fills the default pool under a 64 MiB limit until it raises, reads
``cudaMemGetInfo`` right at the raise and re-raises.
user_pool_limit: 64 MiB held in the default pool (no limit), then a ``MemoryPool`` of the
program's own with ``set_limit(USER_POOL_LIMIT_BYTES)`` (48 MiB unless the environment says)
under ``cupy.cuda.using_allocator``: blocks of growing size, each freed after a 4 MiB block
taken beside it, so the pool's free space is splintered, then one 24 MiB block. Under 48 MiB it
raises CuPy's OutOfMemoryError in that pool; nothing is allocated after the last block, so the
recording up to a failure is the whole program (advise's answer holds for the whole run).
default_limit_beside_user_pool: 32 MiB held by a ``MemoryPool`` of the program's own (no limit),
then the default pool, limited to 64 MiB unless a limit is set already (``record --limit``),
takes 6, 7, ..., 13 MiB and holds them (76 MiB in all): its 13 MiB request fails at 64 MiB. The
default pool's limit holds its own bytes alone, so it needs 76 MiB, not 76 + 32.

``--witness PATH`` writes what the program itself saw as JSON: every event of
an independent ``cupy.cuda.MemoryHook`` registered beside the recorder
(``[op, ptr, size]`` for malloc, free and the pool's device allocations), the
blocks the program made and dropped for the async pool (which fires no
hook), each pool's own counters at the end, and the free bytes at an OOM.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path
from typing import Any

import cupy as cp
import numpy as np

MiB = 1 << 20
SEEN: dict[str, Any] = {"events": [], "async": [], "pools": [], "oom_free": None}
KEEP: list[Any] = []  # the program's pools stay alive to the end, so the trace has their final counters


class Witness(cp.cuda.MemoryHook):
    """An independent hook: records what CuPy reports, in call order."""

    name = "witness"

    def malloc_postprocess(self, **kw: Any) -> None:
        if kw["mem_ptr"]:
            SEEN["events"].append(["malloc", kw["mem_ptr"], kw["mem_size"]])

    def free_postprocess(self, **kw: Any) -> None:
        SEEN["events"].append(["free", kw["mem_ptr"], kw["mem_size"]])

    def alloc_postprocess(self, **kw: Any) -> None:
        if kw["mem_ptr"]:
            SEEN["events"].append(["segment_alloc", kw["mem_ptr"], kw["mem_size"]])


def counters(pool: Any) -> dict[str, int]:
    return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes())}


def run_user_pool(steps: int = 8) -> None:
    pool = cp.cuda.MemoryPool()
    KEEP.append(pool)
    cp.cuda.set_allocator(pool.malloc)
    rand = cp.random.RandomState(seed=1)
    streams = [cp.cuda.Stream(non_blocking=True) for _ in range(steps)]
    reduce_stream = cp.cuda.Stream(non_blocking=True)
    zs, events = [], []
    for k, stream in enumerate(streams):
        with stream:
            x = rand.normal(size=(1, (k + 1) * 256 * 1024))
            y = rand.normal(size=((k + 1) * 256 * 1024, 1))
            zs.append(cp.matmul(x, y))
        events.append(stream.record())
    for e in events:
        reduce_stream.wait_event(e)
    with reduce_stream:
        z = sum(zs)
    cp.cuda.Device().synchronize()
    print("sum", float(z[0, 0]), "pool total bytes", pool.total_bytes())
    # events_seen: where in the witness's events the counters were read (the trace's rows line up)
    SEEN["pools"].append({"label": "user 1", **counters(pool), "events_seen": len(SEEN["events"])})
    for stream in streams[: steps // 2]:  # give some streams' blocks back, as map_reduce does
        pool.free_all_blocks(stream=stream)
    SEEN["pools"][-1].update(after_free=counters(pool))


def run_async(steps: int = 40) -> None:
    pool = cp.cuda.MemoryAsyncPool()
    KEEP.append(pool)
    cp.cuda.set_allocator(pool.malloc)
    rng = np.random.default_rng(0)
    side = cp.cuda.Stream(non_blocking=True)
    kept = []
    for i in range(steps):
        n = int(rng.integers(1, 64)) * MiB // 4
        with side if i % 2 else cp.cuda.Stream.null:
            a = cp.ones(n, cp.float32)
            SEEN["async"].append(["malloc", a.data.ptr, a.nbytes])
            b = a * 2
            SEEN["async"].append(["malloc", b.data.ptr, b.nbytes])
            if i % 3 == 0:
                kept.append(b)
            else:
                SEEN["async"].append(["free", b.data.ptr, b.nbytes])
                del b
            SEEN["async"].append(["free", a.data.ptr, a.nbytes])
            del a
    cp.cuda.Device().synchronize()
    SEEN["pools"].append({"label": "user 1", "kept": len(kept), **counters(pool)})


def run_pool_threads(steps: int = 30) -> None:
    pools: list[Any] = [None] * 3
    KEEP.append(pools)

    def worker(k: int) -> None:
        pool = pools[k] = cp.cuda.MemoryPool()
        with cp.cuda.using_allocator(pool.malloc):
            keep = [cp.zeros((k + 1) * 1024 * (i + 1), cp.float32) for i in range(steps)]
            cp.cuda.Device().synchronize()
            SEEN["pools"].append({"thread": k, **counters(pool), "kept": len(keep)})

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run_oom_probe(steps: int = 0) -> None:
    pool = cp.get_default_memory_pool()
    pool.set_limit(size=64 * MiB)
    kept = []
    try:
        while True:
            kept.append(cp.empty(20 * MiB, cp.uint8))
    except cp.cuda.memory.OutOfMemoryError:
        SEEN["oom_free"] = int(cp.cuda.runtime.memGetInfo()[0])  # right at the raise
        SEEN["pools"].append({"label": "default", **counters(pool)})
        raise


def run_user_pool_limit(steps: int = 6) -> None:
    import os

    # cupy.cuda.alloc: raw blocks from the current allocator, as an array's memory is taken
    kept_default = [cp.cuda.alloc(16 * MiB) for _ in range(4)]  # the default pool's 64 MiB
    pool = cp.cuda.MemoryPool()
    KEEP.append(pool)
    pool.set_limit(size=int(os.environ.get("USER_POOL_LIMIT_BYTES", 48 * MiB)))
    with cp.cuda.using_allocator(pool.malloc):
        held = []
        for i in range(steps):
            a = cp.cuda.alloc((8 + 2 * i) * MiB)
            held.append(cp.cuda.alloc(4 * MiB))
            del a
        held.append(cp.cuda.alloc(24 * MiB))
    cp.cuda.Device().synchronize()
    SEEN["pools"].append({"label": "user 1", **counters(pool), "kept": len(held) + len(kept_default)})
    print("user pool total bytes", pool.total_bytes(), "limit", pool.get_limit())


def run_default_limit_beside_user_pool(steps: int = 8) -> None:
    pool = cp.cuda.MemoryPool()
    KEEP.append(pool)
    with cp.cuda.using_allocator(pool.malloc):
        user_held = [cp.cuda.alloc(8 * MiB) for _ in range(4)]
    default = cp.get_default_memory_pool()
    if default.get_limit() == 0:  # record --limit (advise --rerun) sets its own
        default.set_limit(size=64 * MiB)
    held = [cp.cuda.alloc((6 + i) * MiB) for i in range(steps)]
    cp.cuda.Device().synchronize()
    SEEN["pools"].append({"label": "default", **counters(default), "kept": len(held) + len(user_held)})
    print("default pool total bytes", default.total_bytes(), "limit", default.get_limit())


WORKLOADS = {"user_pool": run_user_pool, "user_pool_limit": run_user_pool_limit,
             "default_limit_beside_user_pool": run_default_limit_beside_user_pool, "async": run_async,
             "pool_threads": run_pool_threads,
             "oom_probe": run_oom_probe}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--witness", type=Path, default=None)
    args = ap.parse_args(argv)
    fn = WORKLOADS[args.workload]
    hook = Witness()
    hook.__enter__()
    try:
        fn() if args.steps is None else fn(args.steps)
    finally:
        hook.__exit__(None, None, None)
        if args.witness is not None:
            args.witness.write_text(json.dumps(SEEN))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
