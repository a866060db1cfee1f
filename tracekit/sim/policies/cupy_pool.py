"""``cupy``: CuPy 14.x ``SingleDeviceMemoryPool`` as a simulated allocator.

512-byte rounding; one arena per stream; best fit over free chunks with ties
to the lowest device address (real CuPy breaks ties between equal-size chunks
by the host address of its ``_Chunk`` objects, which no replay can know); a
split keeps the low part; a free merges with free neighbours of the same
device allocation; a miss takes exactly the rounded size from the device.
``SimConfig.capacity`` is ``set_limit``: a miss that would take reserved bytes
over it first releases every free whole device allocation in all arenas
(``free_all_blocks``), then raises OutOfMemoryError if still over.
``SimConfig.device_total`` bounds the device under the pool, counted at the
driver's granularity (whole 2 MiB pages above 1 MiB). Device addresses are
invented (the driver's are not predictable) unless the trace recorded them.

Options (``SimConfig.options``): ``release_points`` ``trace`` (default: release
free whole allocations where the recording shows the pool releasing them) or
``none``; ``addresses`` ``trace`` (default: a new device allocation takes the
recorded address of the same allocation) or ``invent``; ``ties`` ``trace``
(default: among equal-size best fits, take the chunk the recording shows CuPy
taking) or ``address`` (always the lowest address).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from tracekit.errors import UsageError
from tracekit.sim.base import Allocator, Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import NO_REFUSAL, CupySetting, Slot, Stat, named_vector
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op, Source


class CupyPool:
    """CuPy's default memory pool (``cupy.get_default_memory_pool()``), one device."""

    name: ClassVar[str] = "cupy"
    description: ClassVar[str] = (
        "CuPy 14 SingleDeviceMemoryPool: per-stream arenas, best fit, exact-size device "
        "allocations, set_limit with free_all_blocks before OutOfMemoryError"
    )
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.POOL, recorded_limit=True, rank=5,
                                                 reproduces=Source.CUPY,
                                                 models=Allocator.CUPY)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        return self.run_with_state(trace, config)[0]

    def run_with_state(self, trace: Trace, config: SimConfig) -> tuple[PolicyRun, np.ndarray, np.ndarray]:
        """The run, plus the final chunk store and counters (for consistency checks)."""
        unknown = sorted(set(config.options) - {"release_points", "addresses", "ties"})
        if unknown:
            raise UsageError(
                f"unknown cupy policy option {unknown[0]!r} (cupy takes release_points, addresses, ties)"
            )
        ties = config.options.get("ties", "trace")
        if ties not in ("trace", "address"):
            raise UsageError(f"cupy option ties: expected 'trace' or 'address', got {ties!r}")
        # Compiled, on first use (the registry's convention: importing a policy module loads no kernel).
        from tracekit.sim import chunks as ck
        from tracekit.sim.policies._cupy_kernel import cupy_replay
        from tracekit.sim.pool_run import (
            NO_STATUS,
            address_hints,
            addresses_option,
            capacity_for_state,
            given_back,
            next_address,
            pack,
            pool_stats,
            release_option,
            release_points,
            work_arrays,
        )
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        follow = release_option(config.options, "cupy")
        ev = trace.events
        inp = prepare(trace)
        streams, arena = _arenas(inp.pool, inp.streams, inp.stream_index)
        init = inp.initial
        rel = _release_arenas(release_points(ev.op, init) if follow else np.zeros(len(ev), np.bool_),
                              ev.op, arena)
        hints = address_hints(trace, init, addresses_option(config.options, "cupy"))
        cap, rows_cap = capacity_for_state(trace)
        C, R, S = ck.new_state(cap, rows_cap, next_address(trace, init, ck.PAGE))
        stats = pool_stats()
        cfg = named_vector(CupySetting, {
            CupySetting.LIMIT: config.capacity or 0, CupySetting.DEVICE_TOTAL: config.device_total or 0,
            CupySetting.CONTINUE: config.continue_on_oom,
            CupySetting.TIES: ties == "trace" and hints.shape[1] > 0,
        })
        addr, status, blk = work_arrays(len(ev), config.per_event)
        rounded = np.zeros_like(addr)
        try:
            C, R = cupy_replay(
                ev.op, attempt_kinds(inp, config.stop_at_first_oom), inp.replaced_by, holders(inp), inp.size,
                arena, trace.mate, init, ev.addr.view(np.int64), rel, hints, streams.view(np.int64), cfg,
                C, R, S, stats, addr, rounded, status, blk,
            )
        finally:
            given_back(status, blk, config.per_event)
        status = status if config.per_event else NO_STATUS
        # The limit enters the kernel only in its limit tests (``_cupy_kernel._passes``): at a
        # limit from the most a test asked up, this run is the one without a limit; from the most
        # its tests let through up to below the least they refused, this run itself.
        stats[Stat.ASKED] = S[Slot.ASKED]
        stats[Stat.SAME_FROM] = S[Slot.PASSED]
        stats[Stat.SAME_BELOW] = S[Slot.REFUSED] if S[Slot.REFUSED] > 0 else NO_REFUSAL
        return pack(addr, status, rounded, R, S, stats), C, S


def _release_arenas(points: np.ndarray, op: np.ndarray, arena: np.ndarray) -> np.ndarray:
    """Per row, what a recorded release there frees: the one arena all its ``segment_free`` rows
    belong to (``free_all_blocks(stream)``), -1 every arena, -2 (``NO_RELEASE``) none."""
    from tracekit.sim.policies._cupy_kernel import NO_RELEASE

    out = np.full(len(op), NO_RELEASE, np.int64)
    starts = np.flatnonzero(points)
    if len(starts) == 0:
        return out
    n = len(op)
    idx = np.arange(n, dtype=np.int64)
    ends = np.minimum.accumulate(np.where(op == Op.SEGMENT_FREE, n, idx)[::-1])[::-1][starts]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        groups = np.unique(arena[s:e])
        out[s] = int(groups[0]) if len(groups) == 1 else -1
    return out


def _arenas(pool: np.ndarray, streams: np.ndarray, stream_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One arena per (pool, stream): the stream of each arena, and each event's arena.

    A program's own ``MemoryPool`` (the trace's ``pool`` column) never shares
    memory with another pool, as arenas of different streams never do.
    """
    if len(pool) == 0 or not pool.any():
        return streams, stream_index
    key = pool.astype(np.int64) * len(streams) + stream_index
    _, first, arena = np.unique(key, return_index=True, return_inverse=True)
    return streams[stream_index[first]], arena.astype(np.int64)


MODEL = CupyPool()
