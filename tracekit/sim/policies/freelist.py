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

__all__ = ["Fit", "FreeListModel", "HeapSteps"]


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
        # Compiled, on first use (the registry's convention: importing a policy module loads no kernel).
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        self._no_options(config)
        inp = prepare(trace)
        heap = self.stepper(config, len(inp), inp.max_live)
        kind = attempt_kinds(inp, config.stop_at_first_oom)
        holder = holders(inp)
        for lo, hi in progress.chunks(len(inp)):
            if heap.step(kind, inp.size, inp.mate, inp.replaced_by, holder, lo, hi):
                break
        return heap.finish()

    def _no_options(self, config: SimConfig) -> None:
        if config.options:
            raise UsageError(f"policy {self.name} takes no options (got {', '.join(config.options)})")

    def stepper(self, config: SimConfig, n: int, max_live: int) -> HeapSteps:
        """The replay of ``n`` events as steps over ranges of them (``HeapSteps``): ``run`` and a
        replay started while the trace is still read (``tracekit.sim.head_start``)."""
        self._no_options(config)
        return HeapSteps(self.fit, self.says(config), config, n, max_live)


class HeapSteps:
    """One free-list replay of ``n`` events, run a range of events at a time (``step``), in order.

    Its tables are sized for ``max_live`` requests live at once (``grow`` raises that bound before
    a step that may need more: no two free blocks are adjacent, so 2 × live + 2 nodes suffice);
    the placements do not depend on the tables' size, so a replay grown on the way places every
    block where one sized at once does.
    """

    def __init__(self, fit: Fit, says: bool, config: SimConfig, n: int, max_live: int) -> None:
        from tracekit.sim import sizeclass
        from tracekit.sim.policies import _freelist_kernel as k

        self._k, self.fit, self.says, self.config = k, fit, says, config
        cap = UNBOUNDED if config.capacity is None else int(config.capacity)
        out = n if config.per_event else 0  # the per-event outputs: none where only the summary is wanted
        self.rounded = np.zeros(out, np.int64)  # filled by the kernel at allocation attempts
        self.T = np.zeros((self._rows(max_live), LIST_WIDTH), np.int64)
        self.st = named_vector(HeapSlot, {
            HeapSlot.ROOT: -1, HeapSlot.RECYCLE: -1, HeapSlot.NEXT_ID: 1, HeapSlot.ROVER: 0,
            HeapSlot.LIVE: 0, HeapSlot.CAP: cap, HeapSlot.FIT: fit, HeapSlot.STOPPED: 0,
            HeapSlot.GROWS: config.capacity is None, HeapSlot.TOP: 0, HeapSlot.ASKED: 0,
            HeapSlot.PASSED: 0, HeapSlot.REFUSED: 0, HeapSlot.SAYS: says,
        })
        self.stats = heap_stats()
        if fit == Fit.BEST:
            self.roots, self.bm = sizeclass.new_tables()
        else:
            self.roots, self.bm = np.full(1, -1, np.int64), np.zeros(1, np.int64)
        k.seed(self.T, self.st, self.roots, self.bm, cap)
        self.stack = np.empty(4096, np.int64)
        self.node_of = np.empty(n, np.int32)
        self.addr = np.zeros(out, np.uint64)
        self.status = np.zeros(n, np.int8)

    @staticmethod
    def _rows(max_live: int) -> int:
        return 2 * max_live + 2  # no two free blocks are adjacent

    @property
    def stopped(self) -> bool:
        """The replay stopped at its first failed request (``SimConfig.continue_on_oom`` off)."""
        return bool(self.st[HeapSlot.STOPPED])

    def grow(self, max_live: int) -> None:
        """Room for ``max_live`` requests live at once (the nodes kept, the new ones zero)."""
        rows = self._rows(max_live)
        if rows > len(self.T):
            T = np.zeros((max(rows, 2 * len(self.T)), LIST_WIDTH), np.int64)
            T[:len(self.T)] = self.T
            self.T = T

    def step(self, kind: np.ndarray, size: np.ndarray, mate: np.ndarray, rep: np.ndarray, holder: np.ndarray,
             lo: int, hi: int) -> bool:
        """Replay events ``lo`` to ``hi`` (``ReplayInput``'s arrays; ``holders``); True once stopped."""
        if not self.stopped:
            self._k.run_chunk(self.T, self.st, self.stack, self.roots, self.bm, kind, size, mate, rep, holder,
                              self.rounded, self.node_of, self.addr, self.status, self.stats, lo, hi,
                              self.config.continue_on_oom)
        return self.stopped

    def finish(self) -> PolicyRun:
        """The run of the events stepped so far."""
        stats, st = self.stats, self.st
        if self.says:  # where the run is alike (_freelist_kernel._note_choice)
            stats[Stat.ASKED] = st[HeapSlot.ASKED]
            stats[Stat.SAME_FROM] = st[HeapSlot.PASSED]
            stats[Stat.SAME_BELOW] = st[HeapSlot.REFUSED] if st[HeapSlot.REFUSED] > 0 else NO_REFUSAL
        return heap_run(self.config, self.addr, self.status, self.rounded, stats)
