"""Counterfactual input: a recorded trace prepared for replay under a setting it was not run with.

A recording carries hints that make its own replay exact (``docs/fidelity.md``): where
memory was released, device addresses, tie choices, the state a wrapped history starts
from. Replaying it under *another* setting asks what that allocator would have done
with the same requests, so each hint is kept only where it is a fact about the
program rather than about the allocator that ran:

- **Release points.** A run of recorded ``segment_free`` rows is *allocator-internal*
  when the request that follows could not have been served without it: the next row
  is the failing ``oom`` row, or a ``segment_alloc`` of s bytes with
  reserved-before-the-run + s > the recorded limit (PyTorch's and CuPy's
  release-and-retry at the limit), or, when the recording ran with
  ``garbage_collection_threshold`` t, reserved-before-the-run > t × limit (PyTorch's
  garbage collection). Those releases belong to the recorded allocator and are removed;
  every other run (``torch.cuda.empty_cache()``, ``free_all_blocks()`` called by the
  program) is the program's and stays.
- **Settings.** The recorded allocator settings are dropped from the metadata, so the
  candidate's options are the whole setting (PyTorch defaults for every key not given).
- **Addresses and ties** stay: they name the same device allocations as long as the
  replay makes the same device calls, and the kernels ignore a recorded address whose
  range the replay already uses.
- **A wrapped start** (``initial`` rows) is the recorded allocator's state at the cut and
  cannot be recomputed for another setting; ``wrapped_start`` says when a prediction
  rests on it.

``predict(trace, policy, config)`` is the one prediction every verb makes for a setting
(``replay --sim``, ``whatif``, ``advise``): a recording replayed through a pool policy goes
through ``prepare`` and ``counterfactual_replay`` under the whole setting
(``setting``: the recorded PyTorch settings overridden by the options given); anything
else (a raw trace, a heap policy) replays as it is. ``replay --as-recorded`` is the
only way around it: the recording with every hint, exactly as recorded.

``with_release_before(trace, rows)`` adds program releases (``free_all_blocks()`` before
the given requests) for the CuPy candidate that calls it at a call-site.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from tracekit.sim.base import Layout, SimConfig
from tracekit.sim.pool_run import release_points
from tracekit.sim.prepare import prepare as replay_input
from tracekit.trace.arrow import array_of, filled
from tracekit.trace.events import Events, segment_delta
from tracekit.trace.outcome import held_limit
from tracekit.trace.reader import Trace
from tracekit.trace.recorded import TORCH_SETTINGS_KEY
from tracekit.trace.schema import Op, Source
from tracekit.trace.validate import remap_mate

if TYPE_CHECKING:
    from tracekit.sim.head_start import HeadStart

PAGE = 2 << 20
TOP = float(1 << 47)  # the key of a first fresh range: above every user-space address
BASE = 1 << 40  # where a counterfactual layout starts


def initial_mask(trace: Trace) -> np.ndarray:
    """Bool per event: the row rebuilds the state a wrapped history starts from."""
    return replay_input(trace).initial


def internal_releases(trace: Trace, limit: int | None = None) -> np.ndarray:
    """Bool per event: ``segment_free`` rows of runs the recorded allocator made to serve a request."""
    ev = trace.events
    n = len(ev)
    init = initial_mask(trace)
    free = (ev.op == Op.SEGMENT_FREE) & ~init
    out = np.zeros(n, dtype=np.bool_)
    starts = np.flatnonzero(release_points(ev.op, init))
    if len(starts) == 0:
        return out
    if limit is None:
        limit = held_limit(ev, trace.meta)
    reserved = np.cumsum(segment_delta(ev))  # after each row
    # The row after each run: the first row at or after the start that is not a segment_free.
    not_free = np.where(~free, np.arange(n), n)
    after = np.minimum.accumulate(not_free[::-1])[::-1][starts]
    before = np.where(starts > 0, reserved[np.maximum(starts - 1, 0)], 0)
    nxt_op = np.where(after < n, ev.op[np.minimum(after, n - 1)], -1)
    nxt_size = np.where(after < n, ev.size[np.minimum(after, n - 1)].astype(np.int64), 0)
    internal = nxt_op == Op.OOM
    if limit:
        internal |= (nxt_op == Op.SEGMENT_ALLOC) & (before + nxt_size > limit)
        gc = trace.meta.recorded.torch_settings.gc_threshold
        if gc > 0:
            internal |= (nxt_op == Op.SEGMENT_ALLOC) & (before > gc * limit)
    run_id = np.cumsum(release_points(ev.op, init)) - 1
    hit = np.zeros(len(starts) + 1, dtype=np.bool_)
    hit[:-1] = internal
    out[free] = hit[run_id[free]]
    return out


def prepare(trace: Trace, limit: int | None = None) -> Trace:
    """The trace as counterfactual input: allocator-internal releases and recorded settings removed.

    ``limit`` is the limit the recording ran under (default: the one it was held to,
    ``trace.outcome.held_limit``, looked up only where the trace has releases to judge).
    """
    drop = internal_releases(trace, limit)
    out = _keep(trace, ~drop) if drop.any() else trace
    if TORCH_SETTINGS_KEY in trace.meta.extra:
        extra = {k: v for k, v in trace.meta.extra.items() if k != TORCH_SETTINGS_KEY}
        out = replace(out, meta=replace(out.meta, extra=extra))
    return out


def wrapped_start(trace: Trace) -> bool:
    """Whether the trace starts from a rebuilt state (``initial`` rows of a wrapped history)."""
    return bool(initial_mask(trace).any())


def with_release_before(trace: Trace, rows: np.ndarray) -> Trace:
    """``trace`` with a program release (one zero-byte ``segment_free`` row) before each of ``rows``."""
    rows = np.unique(np.asarray(rows, dtype=np.int64))
    z = np.zeros(len(rows), dtype=np.uint64)
    return _insert(trace, rows, np.full(len(rows), Op.SEGMENT_FREE, dtype=np.int8), z, z)


def request_ordinals(trace: Trace, rows: np.ndarray) -> np.ndarray:
    """For rows of ``trace`` (n = the end): how many requests (malloc, free, oom) come before each."""
    ev = trace.events
    req = (ev.op == Op.MALLOC) | (ev.op == Op.FREE) | (ev.op == Op.OOM)
    before = np.r_[0, np.cumsum(req)]
    return before[np.minimum(np.asarray(rows, dtype=np.int64), len(ev))]


def layout(keys: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Non-overlapping addresses in the order of ``keys`` (ascending), 2 MiB aligned, 2 MiB apart."""
    order = np.argsort(keys, kind="stable")
    span = (size[order].astype(np.int64) + PAGE - 1) // PAGE * PAGE + PAGE
    out = np.empty(len(size), dtype=np.uint64)
    out[order] = (BASE + np.r_[0, np.cumsum(span)[:-1]]).astype(np.uint64)
    return out


def address_keys(recorded: np.ndarray) -> np.ndarray:
    """Sort keys for device allocations in creation order; ``recorded`` is -1 for one the run did not make.

    A recorded allocation keeps its recorded address as key. One the recording never made
    is a fresh range, which the H200 driver hands out top-down for large allocations: it
    goes below every allocation made before it (key: the smallest earlier key, minus one).
    """
    keys = np.empty(len(recorded), dtype=np.float64)
    low = float("inf")
    for k, a in enumerate(recorded.astype(np.int64)):
        keys[k] = float(a) if a >= 0 else (low - 1.0 if low != float("inf") else float(TOP))
        low = min(low, keys[k])
    return keys


def with_device_addresses(trace: Trace, ordinal: np.ndarray, size: np.ndarray, keys: np.ndarray) -> Trace:
    """``trace`` with its recorded device allocations replaced by ``size`` allocations made before
    the requests numbered ``ordinal``, laid out in the order of ``keys``: the address hints of
    a counterfactual replay."""
    init = initial_mask(trace)
    ev = trace.events
    keep = ~((ev.op == Op.SEGMENT_ALLOC) & ~init)
    base = _keep(trace, keep) if not keep.all() else trace
    bev = base.events
    req_rows = np.flatnonzero((bev.op == Op.MALLOC) | (bev.op == Op.FREE) | (bev.op == Op.OOM))
    rows = np.r_[req_rows, len(bev)][np.asarray(ordinal, dtype=np.int64)]
    size = np.asarray(size, dtype=np.uint64)
    return _insert(base, rows, np.full(len(rows), Op.SEGMENT_ALLOC, dtype=np.int8), layout(keys, size), size)


def counterfactual_replay(trace: Trace, policy: str, config: SimConfig, rounds: int = 4) -> tuple[Trace, Any]:
    """Replay prepared ``trace`` under ``config``, with device addresses a real run would order alike.

    Round 1 replays with the recorded addresses; when it makes exactly the recorded device
    allocations, that is the answer. Otherwise each emitted device allocation that matches
    a recorded one (same request, same size, in order) keeps its recorded address as sort
    key; the others get ``address_keys``. The allocations are then laid out in key order
    (``layout``) and given as hints for the next round, until the device allocations of two
    rounds agree (or ``rounds`` is reached). Only the order of addresses matters to the
    models (ties between equal blocks, lowest address first), so a layout that keeps the
    order is as good as the driver's own addresses.

    The result's ``Stat.ASKED`` speaks for every round: a capacity from which each round's
    replay is the unbounded one (so each round's input, made from the round before, is too);
    so do its ``Stat.SAME_FROM`` and ``Stat.SAME_BELOW``: capacities at which every round
    replays as it did here.
    """
    from tracekit.sim.codes import Stat
    from tracekit.sim.engine import replay

    ev = trace.events
    rec = np.flatnonzero((ev.op == Op.SEGMENT_ALLOC) & ~initial_mask(trace))
    current, prev = trace, None
    result = replay(current, policy, config)
    if len(rec) == 0:
        return current, result  # nothing recorded to keep in order (synthetic traces): invented addresses
    rec_key = list(zip(request_ordinals(trace, rec).tolist(), ev.size[rec].tolist(), strict=True))
    rec_addr = ev.addr[rec].astype(np.int64)
    asked = [int(result.run.stats[Stat.ASKED])]
    same = [(int(result.run.stats[Stat.SAME_FROM]), int(result.run.stats[Stat.SAME_BELOW]))]
    for _ in range(rounds):
        run = result.run
        sa = np.flatnonzero(run.rows_op == Op.SEGMENT_ALLOC)
        made = list(zip(request_ordinals(current, run.rows_before[sa]).tolist(), run.rows_size[sa].tolist(),
                        strict=True))
        if made == prev or "expandable_segments" in config.options:
            break
        prev = made
        matched = np.full(len(made), -1, dtype=np.int64)
        pool: dict[tuple[int, int], list[int]] = {}
        for j, k in enumerate(rec_key):
            pool.setdefault(k, []).append(j)
        for i, k in enumerate(made):
            if pool.get(k):
                matched[i] = rec_addr[pool[k].pop(0)]
        if (matched >= 0).all() and current is trace:
            break  # the recorded allocations, at their recorded addresses: nothing to reorder
        current = with_device_addresses(trace, np.array([m[0] for m in made], np.int64),
                                        run.rows_size[sa], address_keys(matched))
        result = replay(current, policy, config)
        asked.append(int(result.run.stats[Stat.ASKED]))
        same.append((int(result.run.stats[Stat.SAME_FROM]), int(result.run.stats[Stat.SAME_BELOW])))
    result.run.stats[Stat.ASKED] = max(asked) if min(asked) >= 0 else -1
    known = min(min(f, b) for f, b in same) >= 0
    result.run.stats[Stat.SAME_FROM] = max(f for f, _ in same) if known else -1
    result.run.stats[Stat.SAME_BELOW] = min(b for _, b in same) if known else -1
    return current, result


def uses_counterfactual(trace: Trace, policy: str) -> bool:
    """Whether ``predict`` prepares ``trace`` for ``policy``: a recording (CuPy, PyTorch) and a pool."""
    from tracekit.sim import policies as registry

    pool = registry.get(policy).traits.layout == Layout.POOL
    return pool and trace.meta.source in (Source.TORCH, Source.CUPY)


def setting(trace: Trace, policy: str, options: Mapping[str, str]) -> dict[str, str]:
    """The whole setting ``options`` stand for on ``trace``: for the policy that reproduces
    PyTorch's allocator, the settings the trace was recorded with, overridden by ``options``
    (an ``InputError`` naming the file when the recorded ones are unusable); else ``options``."""
    from tracekit.sim import policies as registry
    from tracekit.sim.policies.torch_caching import with_recorded_settings

    if registry.get(policy).traits.reproduces == Source.TORCH:
        return with_recorded_settings(trace, options)
    return dict(options)


def predict(trace: Trace, policy: str, config: SimConfig,
            started: HeadStart | None = None) -> tuple[Trace, Any]:
    """The prediction for ``trace`` under ``policy`` and ``config`` (see the module docstring):
    (the trace that was replayed, its ``ReplayResult``). ``started``: the replay of ``trace``
    as read, begun during the read (``tracekit.sim.head_start``), used where the trace is replayed
    as it is."""
    from tracekit.sim.engine import replay

    if not uses_counterfactual(trace, policy):
        return trace, replay(trace, policy, config, started)
    whole = replace(config, options=setting(trace, policy, config.options))
    return counterfactual_replay(prepare(trace), policy, whole)


def _insert(trace: Trace, rows: np.ndarray, op: np.ndarray, addr: np.ndarray, size: np.ndarray) -> Trace:
    """New rows (op, addr, size) inserted before the given rows (sorted; n = at the end), in order."""
    if len(rows) == 0:
        return trace
    ev = trace.events
    n = len(ev)
    # New row k goes before old row rows[k]; old row i moves to i + (number of rows[k] <= i).
    shift = np.searchsorted(rows, np.arange(n), side="right")
    old_at = np.arange(n) + shift
    new_at = rows + np.arange(len(rows))
    total = n + len(rows)
    src = np.minimum(rows, n - 1)

    def spread(col: np.ndarray, fill: np.ndarray) -> np.ndarray:
        out = np.empty(total, dtype=col.dtype)
        out[old_at] = col
        out[new_at] = fill
        return out

    z = np.zeros(len(rows), dtype=np.uint64)
    events = Events(
        seq=spread(ev.seq, ev.seq[src]), t_ns=spread(ev.t_ns, ev.t_ns[src]), op=spread(ev.op, op),
        addr=spread(ev.addr, addr.astype(np.uint64)), size=spread(ev.size, size.astype(np.uint64)),
        rounded=spread(ev.rounded, z), stream=spread(ev.stream, ev.stream[src]),
        device=spread(ev.device, ev.device[src]), site=spread(ev.site, np.full(len(rows), -1, np.int32)),
        sites=ev.sites, stack=spread(ev.stack, np.full(len(rows), -1, np.int32)), stacks=ev.stacks,
    )
    mate = np.where(trace.mate >= 0, old_at[np.maximum(trace.mate, 0)], -1)
    extras = None
    if trace.extras is not None:
        idx = np.full(total, -1, dtype=np.int64)
        idx[old_at] = np.arange(n)
        extras = trace.extras.take(array_of(np.where(idx >= 0, idx, 0), pa.int64()))
        if "initial" in extras.column_names:  # an added row is never part of a starting state
            col = filled(extras.column("initial"), False).astype(np.bool_)
            col[new_at] = False
            at = extras.column_names.index("initial")
            extras = extras.set_column(at, "initial", array_of(col, pa.bool_()))
    return replace(trace, events=events, mate=spread(mate, np.full(len(rows), -1, np.int64)),
                   extras=extras)


def _keep(trace: Trace, keep: np.ndarray) -> Trace:
    ev = trace.events
    events = Events(
        seq=ev.seq[keep], t_ns=ev.t_ns[keep], op=ev.op[keep], addr=ev.addr[keep], size=ev.size[keep],
        rounded=ev.rounded[keep], stream=ev.stream[keep], device=ev.device[keep], site=ev.site[keep],
        sites=ev.sites, stack=ev.stack[keep], stacks=ev.stacks,
    )
    extras = trace.extras.filter(array_of(keep, pa.bool_())) if trace.extras is not None else None
    return replace(trace, events=events, mate=remap_mate(trace.mate, keep), extras=extras)
