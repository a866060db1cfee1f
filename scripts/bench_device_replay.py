"""Device replay throughput against a bare loop of the same cudaMalloc/cudaFree calls.

For each workload (a ``random`` synthetic trace with sizes 512 B - 64 MiB, and
a ``small`` one with sizes 512 B - 64 KiB where cudaMalloc is cheapest and the
replay's own per-event work weighs most) the script times:

- ``bare``: a loop over precomputed Python lists calling
  ``cupy.cuda.runtime.malloc``/``free`` and nothing else;
- ``replay``: ``tracekit.device.replay.replay_on_device`` with the ``cuda``
  allocator (latency per call, device_free sampling, bookkeeping);
- ``command``: reading the trace, replaying, building the output trace and
  the JSON summary (no file written);
- the same pair for a CuPy MemoryPool (``bare_pool`` vs ``replay_cupy``).

Each figure is the minimum of ``--repeat`` runs after a warm-up. Target:
replay / bare <= 1.5 for ``cuda``. Prints a table; ``--json`` writes it.

``--allocator torch`` times PyTorch's caching allocator instead, on the same
synthetic workloads and on every committed ``traces/torch-*.parquet``:
``bare`` is a loop of ``torch.cuda.caching_allocator_alloc(size, 0, stream)``
/ ``caching_allocator_delete(ptr)`` over the same requests, then freeing what
is left and ``empty_cache()`` (the cache emptied before each run);
``replay`` is the whole ``replay_torch_on_device`` call (settings, limit,
memory history harvested per span, per-call latency, giving everything
back), ``replay_loop`` its requests alone. Target: replay / bare <= 1.5.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _trace(path: Path, n: int, max_size: int, seed: int) -> Path:
    """A random malloc/free churn over 1,024 slots with log-uniform sizes in [512, max_size]."""
    from tracekit.trace import Events, Op, Source, TraceMeta, write_trace

    rng = np.random.default_rng(seed)
    slots = np.zeros(1024, np.int64)  # 0 = empty, else the slot's current address
    ops = np.empty(n, np.int8)
    size = np.empty(n, np.uint64)
    addr = np.empty(n, np.uint64)
    sz = np.exp(rng.uniform(np.log(512), np.log(max_size), n)).astype(np.uint64)
    pick = rng.integers(0, len(slots), n)
    held = np.zeros(len(slots), np.uint64)
    for i in range(n):  # setup only, not timed
        s = pick[i]
        if slots[s]:
            ops[i], size[i], addr[i] = Op.FREE, held[s], slots[s]
            slots[s] = 0
        else:
            a = (1 << 40) + (i << 26)
            ops[i], size[i], addr[i] = Op.MALLOC, sz[i], a
            slots[s], held[s] = a, (sz[i] + 511) // 512 * 512
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), Events.build(ops, size, addr=addr))
    return path


def _bare_cuda(ops: list, sizes: list, mates: list) -> float:
    from cupy.cuda import runtime

    malloc, free = runtime.malloc, runtime.free
    ptrs = [0] * len(ops)
    t0 = time.perf_counter()
    for i in range(len(ops)):
        o = ops[i]
        if o == 0:
            ptrs[i] = malloc(sizes[i])
        elif o == 1:
            free(ptrs[mates[i]])
            ptrs[mates[i]] = 0
    t = time.perf_counter() - t0
    for p in ptrs:
        if p:
            free(p)
    return t


def _bare_pool(ops: list, sizes: list, mates: list) -> float:
    from cupy.cuda import memory

    pool = memory.MemoryPool()
    mem: list = [None] * len(ops)
    t0 = time.perf_counter()
    for i in range(len(ops)):
        o = ops[i]
        if o == 0:
            mem[i] = pool.malloc(sizes[i])
        elif o == 1:
            mem[mates[i]] = None
    t = time.perf_counter() - t0
    mem.clear()
    pool.free_all_blocks()
    return t


def _best(fn, repeat: int) -> float:
    fn()  # warm-up
    return min(fn() for _ in range(repeat))


def bench(path: Path, repeat: int) -> dict:
    from tracekit.device.capacity import Allocator
    from tracekit.device.replay import DeviceConfig, replay_on_device
    from tracekit.device.result import output_events, summary
    from tracekit.trace import read_trace

    tr = read_trace(path)
    ops, sizes, mates = tr.events.op.tolist(), tr.events.size.tolist(), tr.mate.tolist()

    def replay(alloc: Allocator) -> float:
        t0 = time.perf_counter()
        replay_on_device(tr, DeviceConfig(0, alloc))
        return time.perf_counter() - t0

    def command() -> float:
        t0 = time.perf_counter()
        t = read_trace(path)
        run = replay_on_device(t, DeviceConfig(0, Allocator.CUDA))
        output_events(t, run)
        summary(t, run)
        return time.perf_counter() - t0

    n = len(ops)
    r = {"events": n, "bare": _best(lambda: _bare_cuda(ops, sizes, mates), repeat),
         "replay": _best(lambda: replay(Allocator.CUDA), repeat), "command": _best(command, repeat),
         "bare_pool": _best(lambda: _bare_pool(ops, sizes, mates), repeat),
         "replay_cupy": _best(lambda: replay(Allocator.CUPY), repeat)}
    r["ratio_cuda"] = r["replay"] / r["bare"]
    r["ratio_command"] = r["command"] / r["bare"]
    r["ratio_cupy"] = r["replay_cupy"] / r["bare_pool"]
    return r


def _bare_torch(ops: list, sizes: list, mates: list) -> float:
    import torch

    alloc, delete = torch.cuda.caching_allocator_alloc, torch.cuda.caching_allocator_delete
    stream = torch.cuda.current_stream(0)
    torch.cuda.empty_cache()
    ptrs = [0] * len(ops)
    t0 = time.perf_counter()
    for i in range(len(ops)):
        o = ops[i]
        if o == 0 or o == 4:  # malloc, or an oom row replayed as an attempt
            try:
                ptrs[i] = alloc(sizes[i], 0, stream)
            except torch.OutOfMemoryError:
                break
        elif o == 1 and mates[i] >= 0 and ptrs[mates[i]]:
            delete(ptrs[mates[i]])
            ptrs[mates[i]] = 0
    for p in ptrs:  # giving everything back is part of the loop, as it is of the replay
        if p:
            delete(p)
    torch.cuda.empty_cache()
    return time.perf_counter() - t0


def bench_torch(path: Path, repeat: int) -> dict:
    from tracekit.device.torch_replay import replay_torch_on_device
    from tracekit.trace import read_trace

    tr = read_trace(path)
    ops, sizes, mates = tr.events.op.tolist(), tr.events.size.tolist(), tr.mate.tolist()
    limit = tr.meta.pool_limit_bytes

    loops: list[float] = []

    def replay() -> float:
        t0 = time.perf_counter()
        run = replay_torch_on_device(tr, None, limit, 0)
        t = time.perf_counter() - t0
        loops.append(run.torch.loop_ns / 1e9)
        return t

    r = {"events": len(ops), "bare": _best(lambda: _bare_torch(ops, sizes, mates), repeat),
         "replay": _best(replay, repeat)}
    r["replay_loop"] = min(loops[1:]) if len(loops) > 1 else loops[0]
    r["ratio"] = r["replay"] / r["bare"]
    r["ratio_loop"] = r["replay_loop"] / r["bare"]
    return r


def main_torch(a: argparse.Namespace) -> int:
    import torch

    name = torch.cuda.get_device_name(0)
    out = {"device": name, "torch": str(torch.__version__), "allocator": "torch",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "workloads": {}}
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as d:
        paths = [(label, _trace(Path(d) / f"{label}.parquet", a.events, max_size, 1))
                 for label, max_size in (("random", 64 << 20), ("small", 64 << 10))]
        paths += [(p.stem, p) for p in sorted((root / "traces").glob("torch-*.parquet"))]
        for label, p in paths:
            out["workloads"][label] = r = bench_torch(p, a.repeat)
            print(f"{label:18} {r['events']:>9,} events: bare {r['bare']:.4f} s, replay {r['replay']:.4f} s "
                  f"(x{r['ratio']:.2f}), of which the loop {r['replay_loop']:.4f} s (x{r['ratio_loop']:.2f})")
    print(f"{name}, torch {out['torch']}, {out['date']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--allocator", choices=("cuda", "torch"), default="cuda")
    a = ap.parse_args()
    if a.allocator == "torch":
        return main_torch(a)
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    out = {"device": name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "workloads": {}}
    with tempfile.TemporaryDirectory() as d:
        for label, max_size in (("random", 64 << 20), ("small", 64 << 10)):
            p = _trace(Path(d) / f"{label}.parquet", a.events, max_size, 1)
            out["workloads"][label] = r = bench(p, a.repeat)
            rate = r["events"] / r["bare"]
            print(f"{label:7} {r['events']:,} events: bare {r['bare']:.3f} s ({rate:,.0f} ev/s), "
                  f"replay {r['replay']:.3f} s (x{r['ratio_cuda']:.2f}), whole command {r['command']:.3f} s "
                  f"(x{r['ratio_command']:.2f}); pool bare {r['bare_pool']:.3f} s, replay cupy "
                  f"{r['replay_cupy']:.3f} s (x{r['ratio_cupy']:.2f})")
    print(f"{name}, {out['date']}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
