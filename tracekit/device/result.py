"""From a ``DeviceRun`` to the output trace and the one replay summary (``summary``).

The output is a v1 trace (``source: replay``): the replayed requests in input
order with their real addresses, a failed request as an ``oom`` row, the
allocator's own ``segment_alloc``/``segment_free`` rows inserted where they
happened, renumbered ``seq`` and real ``t_ns`` (ns since the replay started).
Extra columns: ``latency_ns`` (the call's duration), ``device_free``
(cudaMemGetInfo free bytes where sampled, else null) and ``input_seq`` (the
request's seq in the input trace; null for allocator rows). Sizes follow the
format: ``rounded`` = ceil(size / 512) x 512 (the granularity every allocator
here aligns to), a free carries its block's rounded size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.device.capacity import DRIVER_SLACK, Allocator
from tracekit.device.figures import DeviceFigures, DeviceOOM, Latency, TorchFigures
from tracekit.device.replay import DeviceRun
from tracekit.sim.base import Status
from tracekit.sim.result import OOMInfo, ReplaySummary
from tracekit.trace.events import Events
from tracekit.trace.live import live_bytes, paired_frees, round_up
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

EXTRA_FIELDS = (
    pa.field("latency_ns", pa.int64()),
    pa.field("device_free", pa.int64()),
    pa.field("input_seq", pa.uint64()),
)


def live_curve(trace: Trace, run: DeviceRun) -> np.ndarray:
    """Live bytes (sum of rounded sizes of live blocks) after each input event, int64."""
    ev = trace.events
    done = run.status == Status.DONE
    is_malloc = done & ((ev.op == Op.MALLOC) | (ev.op == Op.OOM))
    return live_bytes(round_up(ev.size), is_malloc, done & paired_frees(ev.op, trace.mate), trace.mate)


def output_events(trace: Trace, run: DeviceRun) -> tuple[Events, dict[str, pa.Array]]:
    """The replay as Events plus its extra columns (see the module docstring)."""
    ev, n = trace.events, len(trace.events)
    keep = np.flatnonzero((run.status == Status.DONE) | (run.status == Status.OOM))
    rows = run.rows
    m = len(rows)
    before = np.asarray(rows.before, np.int64)
    order = np.argsort(np.concatenate([2 * keep + 1, 2 * before]), kind="stable")
    r = round_up(ev.size)
    st = run.status[keep]
    op_in = ev.op[keep].copy()
    op_in[(op_in == Op.OOM) & (st == Status.DONE)] = Op.MALLOC  # an oom row that fits here
    op_in[st == Status.OOM] = Op.OOM
    size_in = ev.size[keep].copy()
    frees = op_in == Op.FREE
    size_in[frees] = r[trace.mate[keep[frees]]]
    if len(rows.stream) == m:  # the allocator named each row's stream (torch)
        stream_rows = np.asarray(rows.stream, np.int64).view(np.uint64)
    else:
        stream_rows = ev.stream[np.minimum(before, n - 1)] if n else np.zeros(m, np.uint64)
    init = initial_rows(trace)
    rounded_in = np.where(init[keep] & (ev.rounded[keep] > 0), ev.rounded[keep], r[keep])

    def cat(a: Any, b: Any, dtype: Any) -> np.ndarray:
        return np.concatenate([np.asarray(a, dtype), np.asarray(b, dtype)])[order]

    addr_in = np.where(op_in == Op.OOM, 0, run.addr[keep]).astype(np.uint64)
    out = Events.build(
        op=cat(op_in, rows.op, np.int8),
        size=cat(size_in, rows.size, np.uint64),
        addr=cat(addr_in, rows.addr, np.uint64),
        rounded=cat(np.where(frees, 0, rounded_in), np.zeros(m), np.uint64),
        t_ns=np.maximum.accumulate(cat(run.t_end[keep], rows.t_end, np.int64)) if len(order) else None,
        stream=cat(ev.stream[keep], stream_rows, np.uint64),
        device=np.full(len(order), run.config.device, np.int16),
        site=cat(ev.site[keep], np.full(m, -1), np.int32),
        sites=ev.sites,
    )
    lat = cat(run.latency[keep], rows.latency, np.int64)
    dfree = cat(run.device_free[keep], rows.device_free, np.int64)
    iseq = cat(ev.seq[keep], np.zeros(m), np.uint64)
    is_row = cat(np.zeros(len(keep), bool), np.ones(m, bool), bool)
    extras = {
        "latency_ns": pa.array(lat, pa.int64(), mask=lat < 0),
        "device_free": pa.array(dfree, pa.int64(), mask=dfree < 0),
        "input_seq": pa.array(iseq, pa.uint64(), mask=is_row),
    }
    if run.torch is not None:  # the snapshot importer's columns, so the model replays the output as an import
        extras["initial"] = pa.array(cat(init[keep], run.torch.initial, bool), pa.bool_())
        extras["expandable"] = pa.array(cat(np.zeros(len(keep), bool), run.torch.mapped, bool), pa.bool_())
    return out, extras


def extra_fields(run: DeviceRun) -> tuple[pa.Field, ...]:
    """The output's columns beyond v1 for this run."""
    if run.torch is None:
        return EXTRA_FIELDS
    return (*EXTRA_FIELDS, pa.field("initial", pa.bool_()), pa.field("expandable", pa.bool_()))


def initial_rows(trace: Trace) -> np.ndarray:
    """Bool per input event: the row rebuilds the state before a wrapped history (``initial`` column)."""
    tbl = trace.extras
    if tbl is None or "initial" not in tbl.column_names:
        return np.zeros(len(trace.events), bool)
    return np.asarray(tbl.column("initial").fill_null(False).to_numpy(zero_copy_only=False), bool)


def _usable(allocator: Allocator, free_b: int) -> int:
    """Free bytes that could have served a request: for ``cuda`` the driver never hands out
    the last ``DRIVER_SLACK`` bytes (~3.5 MiB) of cudaMemGetInfo's free figure, so a request
    within that slack is exhaustion, not fragmentation (the device itself does not fragment,
    docs/device-replay.md)."""
    return max(free_b - DRIVER_SLACK, 0) if allocator is Allocator.CUDA else free_b


_PEAK_HOW = {Allocator.CUDA: "sampled", Allocator.CUPY: "exact", Allocator.CUPY_ASYNC: "driver pool",
             Allocator.TORCH: "exact", Allocator.RMM_POOL: "exact"}


def summary(trace: Trace, run: DeviceRun) -> ReplaySummary:
    """The one replay summary (``tracekit.sim.result``) with the ``device`` group, and ``torch`` for it.

    policy: the allocator. device_total: the free memory the replay had (after any
    ballast). peak_reserved_bytes: torch = max over the allocator's own segment
    events, cupy = max sum of the pool's live device allocations (both exact);
    cupy-async = the cudaMemPool ReservedMemHigh attribute; cuda = max of (free at
    replay start - sampled device_free), a lower bound between samples; 0 where the
    driver reports nothing (``device.peak_reserved``: unknown). oom.free_bytes: the
    pool's free bytes, for cuda the device's free memory less the driver's slack
    (``_usable``); oom.largest_free_block: None, no device API reports it.
    """
    ev = trace.events
    live = live_curve(trace, run)
    done = run.status == Status.DONE
    mal = done & ((ev.op == Op.MALLOC) | (ev.op == Op.OOM)) & (run.latency >= 0)  # not the starting state
    fre = done & (ev.op == Op.FREE) & (run.latency >= 0)
    rows_op = np.asarray(run.rows.op, np.int8)
    alloc = run.config.allocator
    oom, st = None, run.oom_state or {}
    if run.first_oom >= 0:
        i = run.first_oom
        free_b = int(st.get("free_bytes", st.get("device_free", 0)))
        oom = OOMInfo(
            seq=int(ev.seq[i]), size=int(ev.size[i]), rounded=int(round_up(ev.size[i: i + 1])[0]),
            free_bytes=_usable(alloc, free_b), largest_free_block=None,
            live_bytes=int(st.get("live_bytes", live[i])),
            reserved_bytes=int(st.get("reserved_bytes", run.free_replay - int(st.get("device_free", 0)))),
        )
    device = DeviceFigures(
        index=run.config.device, allocator=alloc.value,
        replayed=int(np.count_nonzero(run.status != Status.IGNORED)),
        peak_reserved=_PEAK_HOW[alloc] if run.peak_reserved is not None else "unknown",
        malloc_latency_ns=Latency.of(run.latency[mal]), free_latency_ns=Latency.of(run.latency[fre]),
        total=run.total, free_start=run.free_start, free_replay=run.free_replay, free_end=run.free_end,
        ballast_bytes=run.plan.ballast_bytes, oom=_device_oom(st) if oom else None,
    )
    result = ReplaySummary(
        policy=alloc.value, capacity=run.plan.capacity, device_total=run.free_replay, events=len(ev),
        peak_live_bytes=int(live.max()) if len(live) else 0, peak_reserved_bytes=int(run.peak_reserved or 0),
        peak_extent=None, segment_allocs=int(np.count_nonzero(rows_op == Op.SEGMENT_ALLOC)),
        segment_frees=int(np.count_nonzero(rows_op == Op.SEGMENT_FREE)), oom=oom, oom_count=run.ooms,
        stopped=oom is not None and not run.config.continue_on_oom, handled_ooms=run.handled_ooms,
    ).with_figures(device)
    return result if run.torch is None else result.with_figures(torch_figures(run))


def _device_oom(state: dict[str, Any]) -> DeviceOOM | None:
    """The device at the first OOM, when its free memory was measured then."""
    free = state.get("device_free")
    return None if free is None else DeviceOOM(free, state.get("error"))


def torch_figures(run: DeviceRun) -> TorchFigures:
    """The torch replay's own group: settings given and reported, the rebuilt starting state."""
    t = run.torch
    rb = t.rebuilt
    return TorchFigures(
        version=t.torch_version, conf=t.conf, options=tuple(sorted(t.options.items())),
        expandable_segments=bool(t.settings.get("expandable_segments")), release_points=t.release_points,
        initial_segments=rb.segments if rb else 0, initial_blocks=rb.blocks if rb else 0,
        initial_misplaced=rb.misplaced if rb else 0,
    )
