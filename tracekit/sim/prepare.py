"""The kernel-ready form of a trace, decoded once per trace: ``ReplayInput``.

Policies need, per input event: whether it is an allocation attempt
(``malloc`` or a replayed ``oom`` row), a ``free`` or neither (``Kind``); the
requested bytes; for a free the index of its malloc; the index of its stream
among the trace's distinct streams; and the extra columns some traces carry,
decoded here and nowhere else: ``initial`` (rows that rebuild the state at the
start of a wrapped PyTorch history), ``expandable`` (a segment row that is a
cell of a PyTorch expandable segment), ``pool`` (which allocator pool of the
device a row belongs to) and ``segment_type`` (PyTorch's small or large pool of
a segment). ``prepare`` builds these arrays once and caches them on the
``Trace`` object (weakly), so replaying one trace under many capacities or
policies (the what-if search) pays for them once.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from numba import njit

from tracekit.sim.codes import Kind, Op
from tracekit.trace.reader import Trace

SIZE_CLAMP = 1 << 62  # larger requests fit nowhere; clamping keeps int64 sums exact


@dataclass(frozen=True, eq=False)
class ReplayInput:
    """Per input event (arrays of length n):

    - ``kind`` (int8, ``Kind``), ``size`` (int64: requested bytes, clamped to
      2**62), ``mate`` (int64: for a free, the index of its malloc, -1 if none);
    - ``stream_index`` (int64: index into ``streams``, the distinct streams, uint64);
    - ``initial``, ``expandable`` (bool; all False when the trace lacks the column);
    - ``pool`` (int64; 0 when absent);
    - ``segment_small`` (int8: 1 small pool, 0 large, -1 not given).

    ``max_live`` is the largest number of simultaneously live requested blocks
    (an upper bound for kernels sizing their tables).
    """

    kind: np.ndarray
    size: np.ndarray
    mate: np.ndarray
    max_live: int
    streams: np.ndarray
    stream_index: np.ndarray
    initial: np.ndarray
    expandable: np.ndarray
    pool: np.ndarray
    segment_small: np.ndarray

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
        if o == Op.MALLOC or o == Op.OOM:  # a recorded failure is replayed as an attempt
            kind[i] = Kind.ALLOC
            live += 1
            if live > most:
                most = live
        elif o == Op.FREE:
            kind[i] = Kind.FREE
            if mate[i] >= 0:
                live -= 1
        else:
            kind[i] = Kind.OTHER
    return kind, most


def _bool_column(trace: Trace, name: str) -> np.ndarray:
    tbl = trace.extras
    if tbl is None or name not in tbl.column_names:
        return np.zeros(len(trace.events), np.bool_)
    col = tbl.column(name).fill_null(False)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _pool_column(trace: Trace) -> np.ndarray:
    tbl = trace.extras
    if tbl is None or "pool" not in tbl.column_names:
        return np.zeros(len(trace.events), np.int64)
    col = tbl.column("pool").fill_null(0)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.int64)


def _segment_small(trace: Trace) -> np.ndarray:
    tbl = trace.extras
    out = np.full(len(trace.events), -1, np.int8)
    if tbl is None or "segment_type" not in tbl.column_names:
        return out
    kind = np.asarray(tbl.column("segment_type").to_pylist(), dtype=object)
    out[kind == "small"] = 1
    out[kind == "large"] = 0
    return out


def stream_groups(stream: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct streams and, per event, the index of its stream (int64).

    Most traces use one stream; that case skips the O(n log n) sort.
    """
    if len(stream) == 0 or not (stream != stream[0]).any():
        first = stream[:1] if len(stream) else np.zeros(1, np.uint64)
        return first.copy(), np.zeros(len(stream), np.int64)
    streams, index = np.unique(stream, return_inverse=True)
    return streams, index.astype(np.int64)


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
    if len(kind) and int(ev.size.max()) >= SIZE_CLAMP:
        size = np.minimum(ev.size, np.uint64(SIZE_CLAMP)).view(np.int64)
        size.flags.writeable = False  # as the column itself: one compiled kernel either way
    else:
        size = ev.size.view(np.int64)
    streams, stream_index = stream_groups(ev.stream)
    out = ReplayInput(
        kind=kind, size=size, mate=mate, max_live=int(max_live), streams=streams,
        stream_index=stream_index, initial=_bool_column(trace, "initial"),
        expandable=_bool_column(trace, "expandable"), pool=_pool_column(trace),
        segment_small=_segment_small(trace),
    )
    _CACHE[trace] = out
    return out
