"""``buddy``: a binary buddy allocator over one heap, for contrast with the free lists.

A request is rounded up to a power of two, at least 512 bytes (so internal
waste stays below half the block). The heap ``[0, capacity)`` (capacity
rounded down to 512 bytes; unbounded: 2**60 bytes) is cut into the largest
aligned power-of-two blocks that fit, lowest address first. A request of
order k (block 2**k bytes) takes the lowest-addressed free block of the
smallest order j >= k that has one and halves it down to order k, keeping
the low half each time and freeing the high halves. A freed block merges
with its buddy (the block at ``addr XOR 2**k``) while the buddy is free at the
same order. A request fails only when no free block of order >= k exists.
The free blocks of each order sit in their own address-keyed treap.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tracekit import progress
from tracekit.errors import UsageError
from tracekit.sim.base import Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import BUDDY_MAX_ORDER, NFIELDS, named_vector
from tracekit.sim.codes import BuddySlot as B
from tracekit.sim.heap import UNBOUNDED, UNIT, heap_run, heap_stats
from tracekit.trace.reader import Trace

MIN_ORDER = 9  # 512 bytes
MAX_ORDER = BUDDY_MAX_ORDER  # 2**62 bytes: the largest block


def block_order(size: np.ndarray) -> np.ndarray:
    """Requested bytes -> the order k of the smallest block 2**k >= size (k >= 9)."""
    s = np.maximum(size.astype(np.int64), 1)
    k = np.ceil(np.log2(s.astype(np.float64))).astype(np.int64)
    k = np.clip(k, 0, MAX_ORDER)
    # float log2 can be off by one near large powers of two: correct exactly.
    k = np.where((np.int64(1) << k) < s, k + 1, k)
    k = np.where((k > 0) & ((np.int64(1) << np.maximum(k - 1, 0)) >= s), k - 1, k)
    return np.maximum(k, MIN_ORDER)


class Buddy:
    name: ClassVar[str] = "buddy"
    description: ClassVar[str] = "Binary buddy: power-of-two blocks, split in halves, merge with the buddy"
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.HEAP, rank=4)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        if config.options:
            raise UsageError(f"policy buddy takes no options (got {', '.join(config.options)})")
        # Compiled, on first use (the registry's convention: importing a policy module loads no kernel).
        from tracekit.sim.policies import _buddy_kernel as k
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        inp = prepare(trace)
        n = len(inp)
        cap = UNBOUNDED if config.capacity is None else int(config.capacity) // UNIT * UNIT
        order = block_order(inp.size)
        T = np.zeros((1024, NFIELDS), np.int64)
        st = named_vector(B, {B.RECYCLE: -1, B.NEXT_ID: 0, B.LIVE: 0, B.CAP: cap, B.STOPPED: 0})
        roots = np.full(MAX_ORDER + 1, -1, np.int64)
        k.seed_heap(T, st, roots, cap)
        stats = heap_stats()
        addr = np.zeros(n, np.uint64)
        status = np.zeros(n, np.int8)
        kind = attempt_kinds(inp, config.stop_at_first_oom)
        holder = holders(inp)
        for lo, hi in progress.chunks(n):
            T = k.run_chunk(T, st, roots, kind, order, inp.mate, inp.replaced_by, holder, addr, status, stats,
                            lo, hi, config.continue_on_oom)
            if st[B.STOPPED]:
                break
        rounded = np.left_shift(np.int64(1), order)
        return heap_run(config, addr, status, rounded, stats)


MODEL = Buddy()
