"""Write a synthetic RMM allocation log (``logging_resource_adaptor``'s CSV) of N rows.

A training-like pattern in RMM's own format (``tracekit.importers.rmm_log``): per step a few
long-lived buffers and many short-lived ones of mixed sizes on one or two streams, from two
threads, the time of day advancing by microseconds (crossing midnight once when asked), every
block freed before the end (10 million rows in about a minute)::

    .venv/bin/python scripts/rmm_synth_log.py --rows 10000000 -o /tmp/rmm_10m.dev0.csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

HEADER = b"Thread,Time,Action,Pointer,Size,Stream\n"


def _ops(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(is_alloc, block id, size) per row: allocations and frees in a stack-like order with
    some long lives, every block allocated once and freed once."""
    rng = np.random.default_rng(seed)
    blocks = rows // 2
    sizes = np.where(rng.random(blocks) < 0.7, rng.integers(1, 1 << 16, blocks),
                     rng.integers(1 << 16, 64 << 20, blocks)).astype(np.uint64)
    # Each block b is allocated at position 2b-ish and freed after a geometric lifetime.
    life = rng.geometric(0.05, blocks).astype(np.float64)
    life[rng.random(blocks) < 0.01] *= 200  # a few long-lived buffers
    alloc_at = np.arange(blocks, dtype=np.float64) * 2
    free_at = alloc_at + 1 + life * 2 + 0.5
    key = np.concatenate([alloc_at, free_at])
    order = np.argsort(key, kind="stable")
    is_alloc = order < blocks
    block = np.where(is_alloc, order, order - blocks)
    return is_alloc, block, sizes[block]


def write_log(path: Path, rows: int, seed: int = 0, streams: int = 1, midnight: bool = False) -> int:
    """Write the log; returns the data rows written (an even number: every block is freed)."""
    is_alloc, block, size = _ops(rows, seed)
    n = len(is_alloc)
    rng = np.random.default_rng(seed + 1)
    base = np.uint64(0x7F0000000000)
    addr = base + (block.astype(np.uint64) * np.uint64(1 << 27))  # distinct per block, never reused
    start_us = (23 * 3600 + 59 * 60 + 50) * 10**6 if midnight else 10 * 3600 * 10**6
    t_us = (start_us + np.cumsum(rng.integers(1, 20, n))) % (86_400 * 10**6)
    hh, rest = np.divmod(t_us, 3600 * 10**6)
    mm, rest = np.divmod(rest, 60 * 10**6)
    ss, us = np.divmod(rest, 10**6)
    stream = (block % streams).astype(np.uint64) if streams > 1 else np.zeros(n, np.uint64)
    thread = np.where(block % 2 == 0, 140234, 140235).astype(np.uint64)
    with open(path, "wb") as f:
        f.write(HEADER)
        step = 1 << 20
        for lo in range(0, n, step):
            sl = slice(lo, lo + step)
            lines = [
                f"{th},{h:02d}:{m:02d}:{s_:02d}.{u:06d},{'allocate' if al else 'free'},0x{a:x},{sz},"
                f"{'0' if st == 0 else hex(0x5500 + st)}\n"
                for th, h, m, s_, u, al, a, sz, st in zip(
                    thread[sl].tolist(), hh[sl].tolist(), mm[sl].tolist(), ss[sl].tolist(), us[sl].tolist(),
                    is_alloc[sl].tolist(), addr[sl].tolist(), size[sl].tolist(), stream[sl].tolist(),
                    strict=True)
            ]
            f.write("".join(lines).encode())
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--streams", type=int, default=1)
    ap.add_argument("--midnight", action="store_true", help="start 10 s before midnight")
    ap.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    n = write_log(a.output, a.rows, a.seed, a.streams, a.midnight)
    print(f"wrote {a.output}: {n} rows", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
