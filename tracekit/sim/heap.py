"""What the single-heap policies (the free lists and the buddy allocator) share.

The heap is ``[0, capacity)``; without a capacity it is unbounded, modelled
as 2**60 bytes. A replay reports the heap to the analyzer as one
``segment_alloc`` row at the start: ``[0, capacity)``, or when unbounded
``[0, peak extent rounded up to 2 MiB)``. Peak reserved bytes of a heap are
its high-water mark (the peak extent), and the replay summary says so
("peak reserved ... (heap high-water mark)"). Analyzing the replay's output
trace reports the heap segment row as reserved instead: the capacity, or the
high-water mark rounded up to 2 MiB, so that figure can be larger.
"""

from __future__ import annotations

import numpy as np

from tracekit.sim.base import PolicyRun, SimConfig
from tracekit.sim.codes import Stat
from tracekit.trace.live import UNIT, round_up  # noqa: F401  (UNIT: the multiple every policy hands out)
from tracekit.trace.schema import Op

UNBOUNDED = 1 << 60
SEGMENT_ROUND = 2 << 20


def heap_stats() -> np.ndarray:
    """A single heap's stats vector before the replay: zeros, no OOM yet (``FIRST_OOM`` -1)."""
    stats = np.zeros(len(Stat), np.int64)
    stats[Stat.FIRST_OOM] = -1
    stats[Stat.ASKED] = stats[Stat.SAME_FROM] = stats[Stat.SAME_BELOW] = -1
    return stats


def heap_run(config: SimConfig, addr: np.ndarray, status: np.ndarray, rounded: np.ndarray,
             stats: np.ndarray) -> PolicyRun:
    """The ``PolicyRun`` of a single-heap policy: one ``segment_alloc`` row for the heap,
    ``[0, capacity)``, or ``[0, peak extent rounded up to 2 MiB)`` when unbounded."""
    stats[Stat.PEAK_RESERVED] = stats[Stat.PEAK_EXTENT]
    stats[Stat.SEGMENT_ALLOCS] = 1
    stats[Stat.SEGMENT_FREES] = 0
    if config.capacity is None:
        ext = int(stats[Stat.PEAK_EXTENT])
        heap = max(SEGMENT_ROUND, round_up(ext, SEGMENT_ROUND))
    else:
        heap = int(config.capacity)
    return PolicyRun(
        addr=addr,
        status=status,
        rows_before=np.zeros(1, np.int64),
        rows_op=np.array([Op.SEGMENT_ALLOC], np.int8),
        rows_addr=np.zeros(1, np.uint64),
        rows_size=np.array([heap], np.uint64),
        rows_stream=np.zeros(1, np.uint64),
        stats=stats,
        rounded=rounded.view(np.uint64) if len(rounded) or not len(status) else None,  # none: not asked for
    )
