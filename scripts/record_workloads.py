"""Real CuPy workloads recorded into the committed traces (run them under ``tracekit record``).

    python -m tracekit record -o traces/cupy-fft.parquet scripts/record_workloads.py fft
    python -m tracekit record -o traces/cupy-mlp.parquet scripts/record_workloads.py mlp
    python -m tracekit record -o traces/cupy-sort.parquet scripts/record_workloads.py sort
    python -m tracekit record --limit 256MiB -o traces/cupy-oom-frag.parquet \
        scripts/record_workloads.py oom

fft: forward/inverse FFTs of sizes from 1 Ki to 3 Mi points (powers of two, 3·2^k,
5^k and a prime), every other one on a second stream, with cuFFT plan work areas.
mlp: a 512→2048→10 MLP trained by hand-written backprop with batch sizes 64..1024.
sort: unique + sort + argsort of random int arrays of 1 Ki to 4 Mi elements.
oom: a loop over variable batch sizes that keeps a small result per batch on the GPU;
the kept results pin pieces of the pool's cached segments, so a batch of 64 fails
under a 256 MiB pool limit while the pool holds more free bytes than it asked for
(fragmentation). It sets that limit itself if none was set.
threads: allocations from the main thread and a worker thread (recorder tests).
Each workload is also a function ``run_<name>(steps)`` for benchmarks.
"""

from __future__ import annotations

import argparse
import sys
import threading

import cupy as cp
import numpy as np

MiB = 1 << 20


def run_mlp(steps: int = 300, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    cp.random.seed(seed)
    w1 = cp.random.standard_normal((512, 2048), dtype=cp.float32) * 0.02
    b1 = cp.zeros(2048, cp.float32)
    w2 = cp.random.standard_normal((2048, 10), dtype=cp.float32) * 0.02
    b2 = cp.zeros(10, cp.float32)
    batches = [64, 128, 256, 512, 768, 1024]
    lr = 0.1
    loss = cp.zeros((), cp.float32)
    for _ in range(steps):
        b = int(rng.choice(batches))
        x = cp.random.standard_normal((b, 512), dtype=cp.float32)
        y = cp.random.randint(0, 10, b)
        h = x @ w1 + b1
        a = cp.maximum(h, 0)
        logits = a @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        p = cp.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        rows = cp.arange(b)
        loss = -cp.log(p[rows, y] + 1e-9).mean()
        g = p
        g[rows, y] -= 1
        g /= b
        gw2 = a.T @ g
        gb2 = g.sum(axis=0)
        ga = g @ w2.T
        ga[h <= 0] = 0
        gw1 = x.T @ ga
        gb1 = ga.sum(axis=0)
        w1 -= lr * gw1
        b1 -= lr * gb1
        w2 -= lr * gw2
        b2 -= lr * gb2
    return float(loss)


def run_fft(steps: int = 240, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    sizes = [1 << k for k in range(10, 22)] + [3 << k for k in range(10, 20)] + \
            [5 ** k for k in range(5, 10)] + [1_000_003]
    side = cp.cuda.Stream(non_blocking=True)
    err = 0.0
    for i in range(steps):
        n = int(rng.choice(sizes))
        with side if i % 2 else cp.cuda.Stream.null:
            x = cp.random.random(n, dtype=cp.float32).astype(cp.complex64)
            spectrum = cp.fft.fft(x)
            back = cp.fft.ifft(spectrum)
            if i % 8 == 0 and n % 1024 == 0:  # a 2-D transform now and then
                img = x.reshape(1024, -1)
                back2 = cp.fft.ifft2(cp.fft.fft2(img))
                err = max(err, float(cp.abs(back2 - img).max()))
            err = max(err, float(cp.abs(back - x).max()))
    return err


def run_sort(steps: int = 200, seed: int = 0) -> int:
    rng = np.random.default_rng(seed)
    total = 0
    for _ in range(steps):
        n = int(2 ** rng.uniform(10, 22))
        a = cp.random.randint(0, max(n // 2, 1), n)
        u = cp.unique(a)
        s = cp.sort(a)
        order = cp.argsort(a[: n // 4 + 1])
        total += int(u.size) + int(s[-1]) + int(order[0])
    return total


def run_oom(steps: int = 200, seed: int = 0) -> None:
    pool = cp.get_default_memory_pool()
    if pool.get_limit() == 0:
        pool.set_limit(size=256 * MiB)
    rng = np.random.default_rng(seed)
    kept = []
    for step in range(steps):
        batch = int(rng.choice([16, 24, 32, 40, 48, 56, 64]))
        work = cp.empty(batch * MiB // 4, cp.float32)  # 1 MiB of workspace per sample
        work.fill(step)
        kept.append(work[: batch * 16384] * 0.5)  # 64 KiB of results per sample, kept
        del work


def run_threads(steps: int = 50, seed: int = 0) -> int:
    out = []

    def worker() -> None:
        for i in range(steps):
            out.append(int(cp.arange(1000 + i).sum()))  # allocations made in the worker

    t = threading.Thread(target=worker, name="worker")
    t.start()
    main_side = [cp.ones(2000 + i).sum() for i in range(steps)]
    t.join()
    return len(out) + len(main_side)


WORKLOADS = {"mlp": run_mlp, "fft": run_fft, "sort": run_sort, "oom": run_oom, "threads": run_threads}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", choices=sorted(WORKLOADS))
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    fn = WORKLOADS[args.workload]
    result = fn(args.steps, args.seed) if args.steps is not None else fn(seed=args.seed)
    cp.cuda.Device().synchronize()
    pool = cp.get_default_memory_pool()
    print(f"{args.workload}: result {result}, pool used {pool.used_bytes()} total {pool.total_bytes()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
