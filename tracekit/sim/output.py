"""A replay as a v1 trace: the input requests with simulated addresses plus the allocator's rows.

Rows, in order: each input ``malloc`` (or replayed fatal ``oom`` row) that was
placed becomes a ``malloc``; a handled ``oom`` row the replay could serve
(``Status.TRIED``) leaves only the segment rows it caused (a retry it stood in
for is written as a ``malloc`` at its address) with the simulated address and the policy's
rounding; each performed ``free`` carries the block's simulated address and
rounded size; each failed request becomes an ``oom`` row (addr null); the
policy's ``segment_alloc``/``segment_free`` rows are inserted before the input
event they precede, in emission order, taking that event's ``t_ns``. Skipped
and ignored input rows (input ``segment_*`` rows, frees of failed requests,
everything after a stopping OOM) are left out. ``seq`` is renumbered 0..n-1;
``t_ns``, ``stream``, ``device``, ``site`` and any extra input columns come
from the input row (extra columns are null on the policy's rows). The output
is built with whole-array NumPy operations.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tracekit import __version__
from tracekit.outputs import check_output
from tracekit.sim.base import PolicyRun, Status
from tracekit.sim.codes import Kind
from tracekit.sim.prepare import prepare
from tracekit.trace.arrow import array_of
from tracekit.trace.events import Events
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op, Source, TraceMeta
from tracekit.trace.writer import write_trace

if TYPE_CHECKING:
    from tracekit.sim.engine import ReplayResult


def replay_events(run: PolicyRun, trace: Trace) -> tuple[Events, np.ndarray]:
    """The output events, and per output row the input index it came from (-1: policy row)."""
    ev = trace.events
    inp = prepare(trace)
    n = len(ev)
    st = run.status
    kept = np.flatnonzero((st == Status.DONE) | (st == Status.OOM))
    rb = run.rows_before.astype(np.int64, copy=False)
    if len(rb) > 1 and np.any(np.diff(rb) < 0):
        raise ValueError("PolicyRun.rows_before must be non-decreasing")
    m = len(rb)
    total = len(kept) + m
    row_pos = np.searchsorted(kept, rb, side="left") + np.arange(m, dtype=np.int64)
    in_pos = np.arange(len(kept), dtype=np.int64) + np.searchsorted(rb, kept, side="right")
    src = np.full(total, -1, dtype=np.int64)
    src[in_pos] = kept

    kind = inp.kind[kept]
    is_oom = st[kept] == Status.OOM
    is_free = kind == Kind.FREE
    mate = np.where(is_free, trace.mate[kept], 0)
    rounded_in = run.rounded if run.rounded is not None else ev.rounded

    op = np.empty(total, np.int8)
    op[in_pos] = np.where(is_oom, Op.OOM, np.where(is_free, Op.FREE, Op.MALLOC))
    op[row_pos] = run.rows_op
    addr = np.zeros(total, np.uint64)
    addr[in_pos] = np.where(is_oom, 0, run.addr[np.where(is_free, mate, kept)])
    addr[row_pos] = run.rows_addr
    size = np.empty(total, np.uint64)
    free_size = rounded_in[mate] if run.rounded is not None else ev.size[kept]
    size[in_pos] = np.where(is_free, free_size, ev.size[kept])
    size[row_pos] = run.rows_size
    rounded = np.zeros(total, np.uint64)
    rounded[in_pos] = np.where((kind == Kind.ALLOC) | (kind == Kind.TRY), rounded_in[kept], 0)

    at = np.minimum(rb, max(n - 1, 0))  # policy rows take the time of the event they precede
    t_ns = np.zeros(total, np.int64)
    stream = np.zeros(total, np.uint64)
    device = np.zeros(total, np.int16)
    site = np.full(total, -1, np.int32)
    for col, arr in ((t_ns, ev.t_ns), (stream, ev.stream), (device, ev.device)):
        col[in_pos] = arr[kept]
        if n:
            col[row_pos] = arr[at]
    stream[row_pos] = run.rows_stream
    site[in_pos] = ev.site[kept]
    stack = np.full(total, -1, np.int32)  # the requests keep their whole stacks; allocator rows have none
    stack[in_pos] = ev.stack[kept]
    out = Events(
        seq=np.arange(total, dtype=np.uint64), t_ns=t_ns, op=op, addr=addr, size=size,
        rounded=rounded, stream=stream, device=device, site=site, sites=ev.sites,
        stack=stack, stacks=ev.stacks,
    )
    return out, src


def replay_meta(result: ReplayResult, trace: Trace, command: str | None) -> TraceMeta:
    cfg = result.config
    return TraceMeta.new(
        Source.REPLAY,
        device=trace.meta.device,
        pool_limit_bytes=cfg.capacity,
        command=command,
        versions={"tracekit": __version__},
    ).with_extra(
        policy=result.policy,
        capacity=cfg.capacity,
        device_total=cfg.device_total,
        options=dict(cfg.options),
        continue_on_oom=cfg.continue_on_oom,
        replay_of=str(trace.path) if trace.path else None,
    )


def write_replay_trace(result: ReplayResult, trace: Trace, path: Path, *, command: str | None) -> Path:
    inputs = (trace.path,) if trace.path is not None else ()
    check_output(path, inputs, force=True)  # the caller refused an existing file unless --force
    out, src = replay_events(result.run, trace)
    extras: dict[str, np.ndarray | pa.Array] = {}
    if trace.extras is not None and trace.extras.num_columns:
        idx = array_of(src, pa.int64(), mask=src < 0)
        taken = trace.extras.take(idx)
        # Every row went through the one simulated allocator: the recording's pools are not the replay's
        # (its own segment rows would read as the default pool's), so no pool column is written.
        extras = {name: taken.column(name).combine_chunks() for name in taken.column_names if name != "pool"}
        if "initial" in extras:
            extras["initial"] = _initial_with_policy_rows(trace, src)
    return write_trace(path, replay_meta(result, trace, command), out, extras)


def _initial_with_policy_rows(trace: Trace, src: np.ndarray) -> np.ndarray:
    """``initial`` per output row; a policy row takes the value of the input row it precedes.

    So the segments a policy creates to hold the starting state are marked as
    part of that state, like the input's own initial rows.
    """
    init_in = prepare(trace).initial
    n = len(init_in)
    # Index of the next input row at or after each output row (n past the last one).
    nxt = np.where(src >= 0, src, n)[::-1]
    nxt = np.minimum.accumulate(nxt)[::-1]
    padded = np.append(init_in, False)
    return padded[nxt]
