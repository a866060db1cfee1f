"""The kernel-ready form of a trace's user requests, computed once per trace.

Policies need, per input event: whether it is an allocation attempt
(``malloc`` or a replayed ``oom`` row), a ``free`` or neither; the requested
bytes; the stream; and for a free the index of its malloc. ``prepare`` builds
these arrays once and caches them on the ``Trace`` object (weakly), so
replaying one trace under many capacities or policies (the what-if search)
pays for them once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

ALLOC, FREE, OTHER = 0, 1, 2


@dataclass(frozen=True, eq=False)
class ReplayInput:
    """Per input event: ``kind`` (int8: ALLOC, FREE, OTHER), ``size`` (int64:
    requested bytes for an allocation attempt), ``mate`` (int64: for a free,
    the index of its malloc, -1 if none), ``stream`` (uint64). ``max_live`` is
    the largest number of simultaneously live requested blocks (an upper bound
    for kernels sizing their tables)."""

    kind: np.ndarray
    size: np.ndarray
    mate: np.ndarray
    stream: np.ndarray
    max_live: int

    def __len__(self) -> int:
        return len(self.kind)


_CACHE: weakref.WeakKeyDictionary[Trace, ReplayInput] = weakref.WeakKeyDictionary()


def prepare(trace: Trace) -> ReplayInput:
    """The ``ReplayInput`` of ``trace`` (cached for the trace object's lifetime)."""
    hit = _CACHE.get(trace)
    if hit is not None:
        return hit
    ev = trace.events
    op = ev.op
    kind = np.full(len(op), OTHER, dtype=np.int8)
    kind[(op == Op.MALLOC) | (op == Op.OOM)] = ALLOC
    kind[op == Op.FREE] = FREE
    # Sizes beyond 2**62 bytes cannot fit anywhere; clamping keeps int64 sums exact.
    if len(op) and int(ev.size.max()) >= 2**62:
        size = np.minimum(ev.size, np.uint64(2**62)).view(np.int64)
    else:
        size = ev.size.view(np.int64)
    # Kernels read mate only at frees (a free without a malloc, mate -1, frees nothing).
    mate = trace.mate
    step = (kind == ALLOC).astype(np.int8) - ((kind == FREE) & (mate >= 0)).astype(np.int8)
    max_live = int(np.cumsum(step, dtype=np.int32).max()) if len(step) else 0
    out = ReplayInput(kind, size, mate, ev.stream, max(max_live, 0))
    _CACHE[trace] = out
    return out
