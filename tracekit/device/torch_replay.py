"""Replaying a trace through PyTorch's own CUDA caching allocator on a real GPU.

``replay_torch_on_device(trace, conf, capacity, device)`` is the library entry
point (``replay --device N --allocator torch`` and ``advise --verify-on-device``
both call it). It plans the settings (the trace's recorded
``torch_allocator_settings`` overridden by ``conf``), sets the allocator up
(``TorchBackend``), rebuilds a wrapped history's starting state
(``torch_initial``), replays every request (``TorchLoop``) and gives
everything back on every way out (live blocks, the cache, settings, limit),
also on Ctrl-C and SIGTERM. The result is a ``DeviceRun`` whose rows are the
allocator's own segment events from its memory history; ``torch_compare.device_reserved``
turns them into reserved bytes after every request.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tracekit.device.allocators import SegmentLog
from tracekit.device.capacity import Allocator, CapacityPlan, deferred_signals
from tracekit.device.loops import Attempts, Loop
from tracekit.device.run import DeviceConfig, DeviceRun
from tracekit.device.torch_backend import TorchBackend
from tracekit.device.torch_initial import Rebuilt, rebuild
from tracekit.device.torch_loop import TorchLoop
from tracekit.device.torch_settings import plan_settings
from tracekit.errors import DeviceError
from tracekit.sim.base import Status
from tracekit.sim.options import parse_alloc_conf
from tracekit.sim.pool_run import release_points, retry_releases
from tracekit.sim.prepare import prepare, stream_groups
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op


@dataclass(frozen=True, eq=False)
class TorchRun:
    """What the torch replay adds to a ``DeviceRun``.

    ``conf``: the string given to ``_set_allocator_settings``; ``settings``: the
    allocator's own report of them (a snapshot's ``allocator_settings``);
    ``options``: the merged options in the model's syntax; ``mapped``: per
    emitted row, whether it is a 2 MiB page of an expandable segment;
    ``initial``: per emitted row, whether it belongs to the rebuilt starting state.
    """

    conf: str
    settings: Mapping[str, Any]
    options: Mapping[str, str]
    release_points: bool
    torch_version: str
    rebuilt: Rebuilt | None
    mapped: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    initial: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    loop_ns: int = 0  # the replay itself: rebuilding the starting state, the requests, the history


def replay_torch_on_device(trace: Trace, conf: str | Mapping[str, str] | None = None,
                           capacity: int | None = None, device: int = 0, *,
                           continue_on_oom: bool = False, sample_every: int | None = None) -> DeviceRun:
    """Replay every malloc and free of ``trace`` through PyTorch's caching allocator on ``device``.

    ``conf``: allocator settings in PyTorch's ``key:value,...`` syntax (or as a
    mapping) overriding the trace's recorded ones key by key, plus tracekit's
    ``release_points:trace|none``; ``capacity``: the per-process limit in bytes
    (``set_per_process_memory_fraction``, exact), None for none (pass
    ``trace.meta.pool_limit_bytes`` for the recorded one). Returns a
    ``DeviceRun``: ``status``/``addr``/``latency`` per input event,
    ``first_oom`` (input index, -1 none), ``peak_reserved`` (bytes) and the
    allocator's segment rows (``rows``), with ``torch`` (a ``TorchRun``) holding
    the settings used; ``torch_compare.device_reserved(trace, run)`` gives
    reserved bytes after every input event, ``torch_compare.compare_with_model``
    the first request where the ``torch`` model differs. Raises UsageError for bad settings or a capacity
    above the free memory, DeviceError when PyTorch or the device fails;
    everything taken is given back before it returns or raises.
    """
    options = parse_alloc_conf(conf) if isinstance(conf, str) else dict(conf or {})
    cfg = DeviceConfig(device=device, allocator=Allocator.TORCH, capacity=capacity,
                       continue_on_oom=continue_on_oom, sample_every=sample_every, options=options)
    return replay_torch(trace, cfg)


def replay_torch(trace: Trace, cfg: DeviceConfig) -> DeviceRun:
    """The torch replay for a ``DeviceConfig`` (``cfg.options``: the settings, as parsed options)."""
    plan = plan_settings(trace.meta.recorded.torch_settings.raw, cfg.options)
    ev = trace.events
    init = prepare(trace).initial
    ops = np.where(init, -1, ev.op.astype(np.int64))  # the starting state is rebuilt, not replayed
    sizes, mates = ev.size.astype(np.int64), trace.mate.astype(np.int64)
    oversize_first = plan.expected.max_split_size < (1 << 62)  # max_split_size_mb is set
    release = (releases(trace, init, cfg.capacity, oversize_first) if plan.release_points
               else np.zeros(len(ev), bool))
    streams, sidx = stream_groups(ev.stream)
    backend = TorchBackend(cfg.device, plan, cfg.capacity)
    log = SegmentLog()
    with deferred_signals() as pending:
        lp = Loop(len(ev), cfg.continue_on_oom, cfg.sample_every, pending,
                  Attempts.of(trace, cfg.stop_at_first_oom))
        handles = backend.open_streams(streams)[sidx]
        free_start, total = backend.free_total()
        rebuilt = None
        try:
            backend.start()
            free_replay = backend.device_free()
            t_start = time.perf_counter_ns()
            loop = TorchLoop(lp, backend, log)
            if init.any():
                rebuilt = rebuild(trace, init, backend, handles)
                lp.live.update(rebuilt.addr)
                loop.take_initial(backend.harvest())
            loop.run(ops, sizes, mates, handles, release)
            t_loop = time.perf_counter_ns() - t_start
        except BaseException as e:
            for err in backend.close(_live(lp)):
                e.add_note(f"also while releasing device memory: {err}")
            raise
        errors = backend.close(_live(lp))
        if errors:
            raise DeviceError(f"device {cfg.device}: could not give back all memory after the replay "
                              f"({len(errors)} error(s), first: {errors[0]})")
        free_end = backend.device_free()
    if rebuilt is not None:
        rows = np.fromiter(rebuilt.addr.keys(), np.int64, len(rebuilt.addr))
        lp.status[rows] = Status.DONE
        lp.addr[rows] = np.fromiter(rebuilt.addr.values(), np.int64, len(rebuilt.addr)).view(np.uint64)
    lp.t_end[lp.t_end > 0] -= t_start
    log.t_end[:] = [max(t - t_start, 0) for t in log.t_end]
    run = DeviceRun(cfg, CapacityPlan(cfg.capacity, 0, cfg.capacity), lp.status, lp.addr, lp.latency,
                    lp.t_end, lp.device_free, log, total, free_start, free_replay, free_end,
                    None, lp.ooms, lp.first_oom, lp.oom_state, handled_ooms=lp.handled_ooms)
    info = TorchRun(plan.conf, backend.settings, dict(plan.options), plan.release_points,
                    str(backend.torch.__version__), rebuilt, np.asarray(loop.mapped, bool),
                    np.asarray(loop.initial, bool), t_loop)
    return replace(run, peak_reserved=int(_reserved_curve(run).max(initial=0)), torch=info)


def releases(trace: Trace, init: np.ndarray, capacity: int | None, oversize_first: bool) -> np.ndarray:
    """Bool per event: call ``empty_cache()`` before it.

    The program's own releases (``tracekit.sim.pool_run.retry_releases``) always.
    A recorded release that was the allocator retrying a request: without
    ``max_split_size_mb`` PyTorch's retry releases every cached block
    (``release_cached_blocks``, what ``empty_cache()`` does), so ``empty_cache()``
    before the request stands in for it, also where the replay's PyTorch would
    not retry by itself (the recorded ``cudaMalloc`` failed for a reason the
    trace does not show: ``torch-handled-oom``, request 434). With
    ``max_split_size_mb`` (``oversize_first``) the retry first releases only
    oversize blocks, which ``empty_cache()`` cannot stand in for: under a limit
    it is left to PyTorch, which retries by itself where the limit makes it;
    without a limit nothing would make it retry, so ``empty_cache()`` does.
    """
    ev = trace.events
    own, retry = retry_releases(ev.op, ev.size.astype(np.int64), init)
    if capacity is not None and oversize_first:
        return own
    # the first recorded segment_free of each run a retry released: the release points the run began at
    return own | (release_points(ev.op, init) & ~own & _retry_runs(ev.op, retry))


def _retry_runs(op: np.ndarray, retry: np.ndarray) -> np.ndarray:
    """Bool per event: a run of recorded segment_free rows that ends at a request with ``retry`` > 0."""
    n = len(op)
    seg = (op == Op.SEGMENT_ALLOC) | (op == Op.SEGMENT_FREE)
    nxt = np.minimum.accumulate(np.where(seg, n, np.arange(n))[::-1])[::-1]  # next non-segment row
    return (op == Op.SEGMENT_FREE) & (retry[np.minimum(nxt, n - 1)] > 0) & (nxt < n)


def _live(lp: Loop) -> list[int]:
    ptrs = [int(p) for p in lp.live.values()]
    lp.live.clear()
    return ptrs


def _reserved_curve(run: DeviceRun) -> np.ndarray:
    """Reserved bytes after each emitted row, in emission order."""
    op = np.asarray(run.rows.op, np.int8)
    size = np.asarray(run.rows.size, np.int64)
    return np.cumsum(np.where(op == Op.SEGMENT_ALLOC, size, -size))
