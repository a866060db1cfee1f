"""The address-ordered free list over one contiguous heap, with four placement policies.

The heap is ``[0, capacity)``. Without a capacity it is unbounded and grows
only when no free block below its top fits, as a heap grown with ``sbrk``
would: the free space above the highest block is the last resort of every
policy (first and best fit pick it last anyway; next fit wraps around and
worst fit takes the largest other block before growing). Requests are
rounded up to a multiple of 512 bytes (at least 512). A placement takes a
free block of at least the rounded size, keeps its low part for the request
and leaves the rest free; a free coalesces the block with both address
neighbours when they are free, so no two free blocks are ever adjacent.
Placement policies (``Fit``):

- first fit: the lowest-addressed free block that fits;
- best fit: the smallest free block that fits, ties to the lowest address;
- next fit: the first fitting free block at or after the roving pointer
  (the end of the previous placement; the free block containing it counts),
  wrapping around to the heap start;
- worst fit: the largest free block, ties to the lowest address.

A request fails (OOM) only when no free block is large enough. The policy
modules ``freelist_*.py`` each expose one ``MODEL``; this module holds their
shared ``run`` and ``_freelist_kernel`` the compiled loop.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tracekit import progress
from tracekit.errors import UsageError
from tracekit.sim.base import PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import LIST_WIDTH, NO_REFUSAL, Fit, HeapSlot, Stat, named_vector
from tracekit.sim.heap import UNBOUNDED, heap_run, heap_stats
from tracekit.trace.reader import Trace

__all__ = ["Fit", "FreeListModel"]


class FreeListModel:
    """Shared ``run`` of the four free-list policies; subclasses set name and fit."""

    name: ClassVar[str]
    description: ClassVar[str]
    traits: ClassVar[PolicyTraits]
    fit: ClassVar[Fit]

    def says(self, config: SimConfig) -> bool:
        """Whether the replay says where it is alike: first and best fit, when asked (it costs
        about 15 % of the replay: ``SimConfig.alike``)."""
        return config.alike and self.fit in (Fit.FIRST, Fit.BEST)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        if config.options:
            raise UsageError(f"policy {self.name} takes no options (got {', '.join(config.options)})")
        # Compiled, on first use (the registry's convention: importing a policy module loads no kernel).
        from tracekit.sim import sizeclass
        from tracekit.sim.policies import _freelist_kernel as k
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        inp = prepare(trace)
        n = len(inp)
        cap = UNBOUNDED if config.capacity is None else int(config.capacity)
        rounded = np.zeros(n, np.int64)  # filled by the kernel at allocation attempts
        rows = 2 * inp.max_live + 2  # no two free blocks are adjacent
        T = np.zeros((rows, LIST_WIDTH), np.int64)
        st = named_vector(HeapSlot, {
            HeapSlot.ROOT: -1, HeapSlot.RECYCLE: -1, HeapSlot.NEXT_ID: 1, HeapSlot.ROVER: 0,
            HeapSlot.LIVE: 0, HeapSlot.CAP: cap, HeapSlot.FIT: self.fit, HeapSlot.STOPPED: 0,
            HeapSlot.GROWS: config.capacity is None, HeapSlot.TOP: 0, HeapSlot.ASKED: 0,
            HeapSlot.PASSED: 0, HeapSlot.REFUSED: 0, HeapSlot.SAYS: self.says(config),
        })
        stats = heap_stats()
        if self.fit == Fit.BEST:
            roots, bm = sizeclass.new_tables()
        else:
            roots, bm = np.full(1, -1, np.int64), np.zeros(1, np.int64)
        k.seed(T, st, roots, bm, cap)
        stack = np.empty(4096, np.int64)
        node_of = np.empty(n, np.int32)
        addr = np.zeros(n, np.uint64)
        status = np.zeros(n, np.int8)
        kind = attempt_kinds(inp, config.stop_at_first_oom)
        holder = holders(inp)
        for lo, hi in progress.chunks(n):
            k.run_chunk(T, st, stack, roots, bm, kind, inp.size, inp.mate, inp.replaced_by, holder, rounded,
                        node_of, addr, status, stats, lo, hi, config.continue_on_oom)
            if st[HeapSlot.STOPPED]:
                break
        if self.says(config):  # where the run is alike (_freelist_kernel._note_choice)
            stats[Stat.ASKED] = st[HeapSlot.ASKED]
            stats[Stat.SAME_FROM] = st[HeapSlot.PASSED]
            stats[Stat.SAME_BELOW] = st[HeapSlot.REFUSED] if st[HeapSlot.REFUSED] > 0 else NO_REFUSAL
        return heap_run(config, addr, status, rounded, stats)
