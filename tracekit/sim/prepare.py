"""The kernel-ready form of a trace, decoded once per trace: ``ReplayInput``.

Policies need, per input event: whether it is an allocation attempt
(``malloc`` or the fatal ``oom`` row), a handled attempt (an ``oom`` row the program
survived, ``trace.outcome.handled_rows``: tried, and released at once when it can be
served), a ``free`` or neither (``Kind``); the
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

from dataclasses import dataclass

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim.codes import Kind, Op
from tracekit.sim.trace_cache import TraceCache
from tracekit.trace.arrow import filled
from tracekit.trace.devices import pool_ids
from tracekit.trace.events import Events
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

    - ``replaced_by`` (int64): for a handled attempt (``Kind.TRY``), the ``malloc`` the program
      made instead (``replacements``), -1 for none and for every other row; **empty** where the
      trace has no handled attempt (no row is ``Kind.TRY``), the common case: no array of n -1s.

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
    replaced_by: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)


@njit(cache=True)
def _classify(op, mate, handled):  # pragma: no cover - compiled
    """One pass: the kind of each event and the most requests live at once (a handled
    attempt is live for a moment: it counts one above the live requests around it)."""
    n = op.shape[0]
    kind = np.empty(n, np.int8)
    live = 0
    most = 0
    for i in range(n):
        o = op[i]
        if o == Op.OOM and handled[i]:  # survived by the program: tried, live at most until its retry's free
            kind[i] = Kind.TRY
            live += 1  # an upper bound: a served attempt is counted until the end
            if live > most:
                most = live
        elif o == Op.MALLOC or o == Op.OOM:  # the fatal failure is replayed as an attempt
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
    return filled(tbl.column(name), False).astype(np.bool_, copy=False)


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


_CACHE: TraceCache[ReplayInput] = TraceCache()


def prepare(trace: Trace) -> ReplayInput:
    """The ``ReplayInput`` of ``trace`` (cached for the trace object's lifetime)."""
    return _CACHE.get(trace, _prepare)


def _prepare(trace: Trace) -> ReplayInput:
    ev = trace.events
    # Kernels read mate only at frees (a free without a malloc, mate -1, frees nothing).
    from tracekit.trace.outcome import handled_rows

    mate = trace.mate
    handled = handled_rows(ev, trace.meta.recorded)
    kind, max_live = _classify(ev.op, mate, handled)
    if len(kind) and int(ev.size.max()) >= SIZE_CLAMP:
        size = np.minimum(ev.size, np.uint64(SIZE_CLAMP)).view(np.int64)
        size.flags.writeable = False  # as the column itself: one compiled kernel either way
    else:
        size = ev.size.view(np.int64)
    streams, stream_index = stream_groups(ev.stream)
    out = ReplayInput(
        kind=kind, size=size, mate=mate, max_live=int(max_live), streams=streams,
        stream_index=stream_index, initial=_bool_column(trace, "initial"),
        expandable=_bool_column(trace, "expandable"), pool=pool_ids(trace),
        segment_small=_segment_small(trace), replaced_by=replacements(ev, handled),
    )
    return out


def attempt_kinds(inp: ReplayInput, stop_at_first_oom: bool) -> np.ndarray:
    """The kinds a kernel replays: ``inp.kind``, or with ``stop_at_first_oom`` every handled
    attempt as a plain one (the replay then ends at the first request that fails)."""
    if not stop_at_first_oom:
        return inp.kind
    return np.where(inp.kind == Kind.TRY, np.int8(Kind.ALLOC), inp.kind).astype(np.int8)


SKIP = -2  # ``stand_in``: a handled attempt an earlier attempt of its chain already stood in for


@plain
def stand_in(kind, rep, holder, i):  # pragma: no cover - compiled
    """What a kernel does with row i before placing it: ``SKIP`` (a handled attempt whose
    retry an earlier, served attempt already stands in for: the program would not have
    made it), the index of the served attempt standing in for this ``malloc`` (the kernel
    hands its block to row i: nothing is allocated), or -1 (place the row as usual).
    ``rep`` and ``holder`` are empty where the trace has no handled attempt (``holders``)."""
    if len(holder) == 0:
        return -1
    k = kind[i]
    if k == Kind.ALLOC:
        return holder[i]
    if k == Kind.TRY and rep[i] >= 0 and holder[rep[i]] >= 0:
        return SKIP
    return -1


NONE_REPLACED = np.full(0, -1, np.int64)  # ``replaced_by`` of a trace without handled attempts
NONE_REPLACED.flags.writeable = False


def holders(inp: ReplayInput) -> np.ndarray:
    """A kernel's table of served handled attempts: per retry row, the attempt standing in its
    place (int64, -1 none; the kernel fills it as it serves attempts, ``replaced_by``). Empty
    where the trace has no handled attempt: a kernel then reads neither it nor ``replaced_by``
    (``stand_in``), and a replay of 10M events makes no 80 MB of -1s (0.17 s of page faults)."""
    return np.full(len(inp), -1, np.int64) if len(inp.replaced_by) else np.zeros(0, np.int64)


def replacements(ev: Events, handled: np.ndarray) -> np.ndarray:
    """Per row: for a handled ``oom`` row, the ``malloc`` that replaced it, else -1.

    The replacement is the next ``malloc`` on the row's device and stream when it comes
    from the same call-site and asks for less (cuDNN's smaller workspace, a caller's
    smaller retry): the program used it for what the failed request was for, so a replay
    that can serve the failed request keeps that block live in the retry's place, until
    the retry's free. A handled row without one (the program did without) has -1. A trace
    without handled rows: ``NONE_REPLACED`` (empty).
    """
    rows = np.flatnonzero(handled)
    if len(rows) == 0:
        return NONE_REPLACED
    out = np.full(len(ev), -1, np.int64)
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    dev, stream = ev.device.astype(np.int64), ev.stream.view(np.int64)
    nxt = np.full(len(rows), -1, np.int64)
    # One mask per (device, stream) of the handled rows: a few, as OOMs come from few streams.
    for d, s in np.unique(np.stack([dev[rows], stream[rows]], axis=1), axis=0).tolist():
        mine = mallocs[(dev[mallocs] == d) & (stream[mallocs] == s)]
        if len(mine) == 0:
            continue
        sel = (dev[rows] == d) & (stream[rows] == s)
        at = np.searchsorted(mine, rows[sel], side="right")
        nxt[sel] = np.where(at < len(mine), mine[np.minimum(at, len(mine) - 1)], -1)
    ok = nxt >= 0
    cand = np.where(ok, nxt, 0)
    same = ok & (ev.site[rows] >= 0) & (ev.site[cand] == ev.site[rows]) & (ev.size[cand] < ev.size[rows])
    out[rows[same]] = nxt[same]
    return out
