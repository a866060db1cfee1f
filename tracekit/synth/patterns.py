"""Synthetic allocation patterns, generated in vectorized chunks.

Each generator yields ``Events`` batches (without seq/t_ns, which the caller
assigns) until at least ``n`` events exist. Addresses are laid out so live
blocks never overlap: every block lives in a region reserved for its slot,
round or step, so a synthetic trace is also a valid raw-device trace.

- ``random``: a bounded live set of ``slots`` slots; each event picks a slot
  at random and frees its block if it holds one, else allocates a
  log-uniform size in [512 B, 64 MiB].
- ``training``: long-lived weights, then steps of a layered forward pass
  (activations kept, a short-lived temporary per layer) and a backward pass
  (a gradient per layer, activations freed in reverse), batch size varying
  per step.
- ``fragmenting``: rounds that interleave short- and long-lived blocks, free
  the short ones, ask for a block larger than any hole, and free the long
  ones several rounds later, so free space splinters.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from tracekit.trace.events import Events
from tracekit.trace.live import round_up
from tracekit.trace.schema import Op

MIN_SIZE = 512
MAX_SIZE = 64 << 20
CHUNK = 1 << 20
BASE = 0x7F00_0000_0000  # a typical CUDA virtual address range


def _events(op, size, addr, rounded, site, sites) -> Events:
    return Events.build(op=op, size=size, addr=addr, rounded=rounded, site=site, sites=sites)


def random_pattern(n: int, rng: np.random.Generator, slots: int = 2048) -> Iterator[Events]:
    """Slot-based random churn; live set bounded by ``slots`` blocks."""
    occupied = np.zeros(slots, dtype=np.bool_)
    cur_size = np.zeros(slots, dtype=np.uint64)
    sites = ("app.py:12:make_buffer", "app.py:20:scratch", "lib/ops.py:88:matmul")
    done = 0
    while done < n:
        c = min(CHUNK, n - done)
        slot = rng.integers(0, slots, c)
        order = np.argsort(slot, kind="stable")
        ss = slot[order]
        rank = np.arange(c) - np.searchsorted(ss, ss, side="left")
        is_free = ((rank + occupied[ss]) % 2) == 1
        req = np.exp(rng.uniform(np.log(MIN_SIZE), np.log(MAX_SIZE), c)).astype(np.uint64)
        rnd = round_up(req)
        # A free returns the block its slot got at the previous event (or before this chunk).
        prev_rnd = np.empty(c, dtype=np.uint64)
        prev_rnd[1:] = rnd[order][:-1]
        prev_rnd[rank == 0] = cur_size[ss[rank == 0]]
        size_sorted = np.where(is_free, prev_rnd, req[order])
        last = np.r_[ss[1:] != ss[:-1], True]
        occupied[ss[last]] = ~is_free[last]
        cur_size[ss[last]] = rnd[order][last]
        inv = np.empty(c, dtype=np.int64)
        inv[order] = np.arange(c)
        free = is_free[inv]
        op = np.where(free, Op.FREE, Op.MALLOC).astype(np.int8)
        addr = np.uint64(BASE) + slot.astype(np.uint64) * np.uint64(MAX_SIZE)
        site = np.where(free, -1, slot % len(sites)).astype(np.int32)
        yield _events(op, size_sorted[inv], addr, np.where(free, 0, rnd), site, sites)
        done += c


def training_pattern(n: int, rng: np.random.Generator, layers: int = 24) -> Iterator[Events]:
    """Weights once, then forward/backward steps with a varying batch size."""
    sites = ("train.py:30:init_weights", "train.py:88:forward", "train.py:91:gelu",
             "train.py:140:backward")
    w = np.exp(rng.uniform(np.log(4 << 20), np.log(64 << 20), layers)).astype(np.uint64)
    w_addr = np.uint64(BASE) + np.r_[0, np.cumsum(round_up(w))[:-1]].astype(np.uint64)
    yield _events(np.zeros(layers, np.int8), w, w_addr, round_up(w), np.zeros(layers, np.int32), sites)
    step_base = int(w_addr[-1] + round_up(w)[-1]) + (1 << 30)
    templates = [_training_step(b, layers, step_base, sites) for b in (8, 16, 24, 32, 48, 64)]
    per_step = len(templates[0])
    done = layers
    while done < n:
        steps = max(1, min(CHUNK, n - done) // per_step + 1)
        pick = rng.integers(0, len(templates), steps)
        parts = [templates[i] for i in pick]
        batch = Events.concat(parts)
        yield batch
        done += len(batch)


def _training_step(batch: int, layers: int, base: int, sites: tuple[str, ...]) -> Events:
    act = np.array([batch * 512 * (1024 + 256 * (i % 4)) for i in range(layers)], np.uint64)
    act_r = round_up(act)
    act_addr = np.uint64(base) + np.r_[0, np.cumsum(act_r)[:-1]].astype(np.uint64)
    scratch = np.uint64(base + int(act_r.sum()))
    op, size, addr, rnd, site = [], [], [], [], []

    def add(o: Op, s: int, a: int, r: int, st: int) -> None:
        op.append(o)
        size.append(s)
        addr.append(a)
        rnd.append(r)
        site.append(st)

    for i in range(layers):
        add(Op.MALLOC, int(act[i]), int(act_addr[i]), int(act_r[i]), 1)
        tmp = int(act[i]) // 2 + 96
        add(Op.MALLOC, tmp, int(scratch), int(round_up(np.uint64(tmp))), 2)
        add(Op.FREE, int(round_up(np.uint64(tmp))), int(scratch), 0, -1)
    for i in reversed(range(layers)):
        g = int(act[i])
        add(Op.MALLOC, g, int(scratch), int(act_r[i]), 3)
        add(Op.FREE, int(act_r[i]), int(act_addr[i]), 0, -1)
        add(Op.FREE, int(act_r[i]), int(scratch), 0, -1)
    return _events(np.array(op, np.int8), np.array(size, np.uint64), np.array(addr, np.uint64),
                   np.array(rnd, np.uint64), np.array(site, np.int32), sites)


def fragmenting_pattern(
    n: int, rng: np.random.Generator, pairs: int = 32, delay: int = 8
) -> Iterator[Events]:
    """Interleaved short/long-lived blocks; shorts die at once, longs ``delay`` rounds later."""
    sites = ("frag.py:10:alloc_short", "frag.py:11:alloc_long", "frag.py:20:alloc_big")
    region = 2 * pairs * (4 << 20)
    big_addr = BASE + (delay + 1) * region
    width = 4 * pairs + 2
    carry_addr = np.zeros((delay, pairs), np.uint64)
    carry_size = np.zeros((delay, pairs), np.uint64)
    round_no = 0
    done = 0
    while done < n:
        rounds = max(1, min(CHUNK, n - done) // width + 1)
        r_idx = round_no + np.arange(rounds)
        sizes = round_up(rng.integers(1 << 20, 4 << 20, (rounds, 2 * pairs)).astype(np.uint64))
        offs = np.cumsum(sizes, axis=1) - sizes
        region_of = (r_idx % (delay + 1)).astype(np.uint64) * np.uint64(region)
        addrs = np.uint64(BASE) + region_of[:, None] + offs
        big = round_up(rng.integers(8 << 20, 16 << 20, rounds).astype(np.uint64))
        # The long blocks (odd columns) of round r die at the start of round r + delay.
        all_long_a = np.vstack([carry_addr, addrs[:, 1::2]])
        all_long_s = np.vstack([carry_size, sizes[:, 1::2]])
        dead_a, dead_s = all_long_a[:rounds], all_long_s[:rounds]
        carry_addr, carry_size = all_long_a[rounds:], all_long_s[rounds:]
        op = np.empty((rounds, width), np.int8)
        size = np.empty((rounds, width), np.uint64)
        addr = np.empty((rounds, width), np.uint64)
        rnd = np.zeros((rounds, width), np.uint64)
        site = np.full((rounds, width), -1, np.int32)
        p = pairs
        op[:, :p], size[:, :p], addr[:, :p] = Op.FREE, dead_s, dead_a
        op[:, p:3 * p], size[:, p:3 * p], addr[:, p:3 * p] = Op.MALLOC, sizes, addrs
        rnd[:, p:3 * p] = sizes
        site[:, p:3 * p] = np.tile([0, 1], p)
        op[:, 3 * p:4 * p], size[:, 3 * p:4 * p], addr[:, 3 * p:4 * p] = Op.FREE, sizes[:, ::2], addrs[:, ::2]
        op[:, -2], size[:, -2], addr[:, -2], rnd[:, -2], site[:, -2] = Op.MALLOC, big, big_addr, big, 2
        op[:, -1], size[:, -1], addr[:, -1] = Op.FREE, big, big_addr
        keep = np.ones((rounds, width), np.bool_)
        keep[:, :p] = (r_idx >= delay)[:, None]
        k = keep.ravel()
        yield _events(op.ravel()[k], size.ravel()[k], addr.ravel()[k], rnd.ravel()[k], site.ravel()[k], sites)
        round_no += rounds
        done += int(k.sum())
