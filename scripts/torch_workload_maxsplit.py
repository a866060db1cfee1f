"""A PyTorch program that drives the caching allocator's release path under ``max_split_size_mb``.

Run it under ``tracekit record --torch`` with ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:M``.
It caps the process with ``set_per_process_memory_fraction`` (``--cap-gib``, default 3 GiB),
then makes large requests of varying sizes (64 MiB - 900 MiB, byte counts not rounded), some
medium and small ones, a quarter of them on a side stream, freeing at random so that the live
bytes stay near half the cap. Blocks of at least M are never split, so freed ones stay cached
whole until a request no longer fits under the cap: then PyTorch runs
``release_available_cached_blocks`` (one cached block >= max(request, M) on the request's
stream and pool, else the largest such blocks until their total reaches that key) before
``release_cached_blocks``. Requests of 1 - 1.5 GiB every few dozen steps force the release; an
out-of-memory error is caught and the program goes on. One ``empty_cache()`` halfway gives a
release that is the program's own. At the end it prints the allocator's counters as JSON.

Usage: python scripts/torch_workload_maxsplit.py [--steps N] [--seed S] [--cap-gib G]
"""

from __future__ import annotations

import argparse
import json
import random

MIB = 1 << 20


def _size(rng: random.Random) -> int:
    """One request's bytes: mostly large (log-uniform 64-900 MiB), some medium, a few small."""
    r = rng.random()
    if r < 0.70:
        return int(64 * MIB * (900 / 64) ** rng.random()) + rng.randrange(0, 4096)
    if r < 0.90:
        return rng.randrange(2 * MIB, 60 * MIB)
    return rng.randrange(1024, MIB)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cap-gib", type=float, default=3.0)
    args = ap.parse_args()
    import torch

    total = torch.cuda.mem_get_info()[1]
    cap = int(args.cap_gib * (1 << 30))
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    rng = random.Random(args.seed)
    side = torch.cuda.Stream()
    live: list[tuple[torch.Tensor, int]] = []
    held = ooms = 0
    for step in range(args.steps):
        if step == args.steps // 2:
            torch.cuda.empty_cache()
        n = _size(rng) if step % 37 else rng.randrange(1024 * MIB, 1536 * MIB)
        while live and (held + n > cap // 2 or rng.random() < 0.35):
            t, b = live.pop(rng.randrange(len(live)))
            del t
            held -= b
        stream = side if rng.random() < 0.25 else torch.cuda.current_stream()
        try:
            with torch.cuda.stream(stream):
                t = torch.empty(n, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:
            ooms += 1
            continue
        live.append((t, n))
        held += n
    live.clear()
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    keys = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
            "reserved_bytes.all.peak", "reserved_bytes.all.current", "allocated_bytes.all.peak")
    print(json.dumps({"ooms_caught": ooms, "cap": cap, **{k: stats.get(k) for k in keys}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
