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
from numba import njit

from tracekit.trace.reader import Trace

ALLOC, FREE, OTHER = 0, 1, 2


@dataclass(frozen=True, eq=False)
class ReplayInput:
    """Per input event: ``kind`` (int8: ALLOC, FREE, OTHER), ``size`` (int64:
    requested bytes for an allocation attempt), ``mate`` (int64: for a free,
    the index of its malloc, -1 if none). ``max_live`` is
    the largest number of simultaneously live requested blocks (an upper bound
    for kernels sizing their tables)."""

    kind: np.ndarray
    size: np.ndarray
    mate: np.ndarray
    max_live: int

    def __len__(self) -> int:
        return len(self.kind)


@njit(cache=True)
def _classify(op, mate):  # pragma: no cover - compiled
    """One pass: the kind of each event and the most requests live at once."""
    n = op.shape[0]
    kind = np.empty(n, np.int8)
    live = 0
    most = 0
    for i in range(n):
        o = op[i]
        if o == 0 or o == 4:  # malloc, or a recorded failure replayed as an attempt
            kind[i] = ALLOC
            live += 1
            if live > most:
                most = live
        elif o == 1:
            kind[i] = FREE
            if mate[i] >= 0:
                live -= 1
        else:
            kind[i] = OTHER
    return kind, most


_CACHE: weakref.WeakKeyDictionary[Trace, ReplayInput] = weakref.WeakKeyDictionary()


def prepare(trace: Trace) -> ReplayInput:
    """The ``ReplayInput`` of ``trace`` (cached for the trace object's lifetime)."""
    hit = _CACHE.get(trace)
    if hit is not None:
        return hit
    ev = trace.events
    # Kernels read mate only at frees (a free without a malloc, mate -1, frees nothing).
    mate = trace.mate
    kind, max_live = _classify(ev.op, mate)
    # Sizes beyond 2**62 bytes cannot fit anywhere; clamping keeps int64 sums exact.
    if len(kind) and int(ev.size.max()) >= 2**62:
        size = np.minimum(ev.size, np.uint64(2**62)).view(np.int64)
    else:
        size = ev.size.view(np.int64)
    out = ReplayInput(kind, size, mate, int(max_live))
    _CACHE[trace] = out
    return out
