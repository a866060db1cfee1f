"""What the pool models (CuPy's pool, PyTorch's caching allocator) share around their kernels.

Before a run: where invented device addresses start, the recorded release
points and device allocations a replay follows (``release_points``,
``address_hints``), the options that switch them off, the starting stats.
After it: the chunk store's counters and emitted rows packed into the
``PolicyRun`` contract of ``tracekit.sim.base``. The per-event inputs come from
``tracekit.sim.prepare``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tracekit.errors import UsageError
from tracekit.sim import chunks as ck
from tracekit.sim.base import PolicyRun
from tracekit.sim.codes import Hint, Row, Slot, Stat
from tracekit.sim.heap import round_up
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op


def next_address(trace: Trace, init: np.ndarray, page: int) -> int:
    """Where new segments start: ``ck.ADDR_BASE``, or one ``page`` above the starting state's
    highest end (rounded up to ``page``) so new segments never overlap imported ones."""
    if not init.any():
        return ck.ADDR_BASE
    ev = trace.events
    top = int((ev.addr[init] + ev.size[init]).max())
    return max(ck.ADDR_BASE, round_up(top, page) + page)


def release_points(op: np.ndarray, init: np.ndarray) -> np.ndarray:
    """Bool per event: the first row of each run of recorded ``segment_free`` rows.

    The program released cached memory there (``torch.cuda.empty_cache()``,
    ``free_all_blocks()``) or the allocator did while retrying a request;
    replaying a release at that point reproduces both (a retry releases the
    same cached blocks a moment later).
    """
    free = (op == Op.SEGMENT_FREE) & ~init
    first = free.copy()
    first[1:] &= ~free[:-1]
    return first


def retry_releases(op: np.ndarray, size: np.ndarray, init: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split the recorded release points into the program's own and the allocator's retries.

    A run of recorded ``segment_free`` rows followed only by segment rows up to
    an allocation attempt, where that attempt got a new ``segment_alloc`` or
    failed (an ``oom`` row), is the allocator releasing cached memory while
    retrying that request: it is returned as the bytes released, per request
    (int64, 0 = none), and not as a release point. Every other run is the
    program's own release (``empty_cache()``, ``free_all_blocks()``): bool per
    row, its first row, as ``release_points`` gives.
    """
    n = len(op)
    rel = release_points(op, init)
    retry = np.zeros(n, np.int64)
    starts = np.flatnonzero(rel)
    if len(starts) == 0:
        return rel, retry
    idx = np.arange(n, dtype=np.int64)
    freed = (op == Op.SEGMENT_FREE) & ~init
    seg = (op == Op.SEGMENT_ALLOC) | (op == Op.SEGMENT_FREE)
    nxt_other = np.minimum.accumulate(np.where(seg, n, idx)[::-1])[::-1]  # next non-segment row
    nxt_kept = np.minimum.accumulate(np.where(freed, n, idx)[::-1])[::-1]  # end of a run of frees
    count = np.concatenate(([0], np.cumsum(freed)))
    allocs = np.concatenate(([0], np.cumsum(op == Op.SEGMENT_ALLOC)))
    freed_bytes = np.concatenate(([0], np.cumsum(np.where(freed, size, 0))))
    end, req = nxt_kept[starts], nxt_other[starts]
    safe = np.minimum(req, n - 1)
    attempt = (req < n) & ((op[safe] == Op.MALLOC) | (op[safe] == Op.OOM))
    alone = count[np.minimum(req, n)] - count[starts] == count[end] - count[starts]
    took = (allocs[np.minimum(req, n)] - allocs[end] > 0) | (op[safe] == Op.OOM)
    is_retry = attempt & alone & took & ~init[safe]
    rel[starts[is_retry]] = False
    retry[req[is_retry]] = freed_bytes[end[is_retry]] - freed_bytes[starts[is_retry]]
    return rel, retry


def address_hints(trace: Trace, init: np.ndarray, use: bool) -> np.ndarray:
    """The recorded device allocations as columns: (request they precede, addr, size, taken).

    Kernels give a new device allocation the address the recorded allocator
    got for the same allocation (``recorded_addr``), so ties broken by address
    fall as they did on the GPU. A recorded ``segment_alloc`` precedes the
    first later row that is not a segment row. Empty when unused or when the
    trace recorded no device allocations (synthetic traces): invented addresses then.
    """
    ev = trace.events
    seg = ((ev.op == Op.SEGMENT_ALLOC) | (ev.op == Op.SEGMENT_FREE)) & ~init
    allocs = np.flatnonzero(seg & (ev.op == Op.SEGMENT_ALLOC))
    if not use or len(allocs) == 0:
        return np.zeros((len(Hint), 0), dtype=np.int64)
    n = len(ev)
    nxt = np.minimum.accumulate(np.where(seg, n, np.arange(n, dtype=np.int64))[::-1])[::-1]
    hints = np.zeros((len(Hint), len(allocs)), dtype=np.int64)
    hints[Hint.BEFORE] = nxt[allocs]
    hints[Hint.ADDR] = ev.addr[allocs].view(np.int64)
    hints[Hint.SIZE] = ev.size[allocs].view(np.int64)
    return hints


def addresses_option(options: Mapping[str, str], policy: str) -> bool:
    """``addresses``: ``trace`` (default) reuses recorded device addresses, ``invent`` never does."""
    value = options.get("addresses", "trace")
    if value not in ("trace", "invent"):
        raise UsageError(f"{policy} option addresses: expected 'trace' or 'invent', got {value!r}")
    return value == "trace"


def release_option(options: Mapping[str, str], policy: str) -> bool:
    """``release_points``: ``trace`` (default) replays recorded releases, ``none`` ignores them."""
    value = options.get("release_points", "trace")
    if value not in ("trace", "none"):
        raise UsageError(f"{policy} option release_points: expected 'trace' or 'none', got {value!r}")
    return value == "trace"


def pool_stats() -> np.ndarray:
    """The int64 stats vector with the not-applicable / not-yet values filled in."""
    stats = np.zeros(len(Stat), dtype=np.int64)
    stats[Stat.PEAK_EXTENT] = -1
    stats[Stat.FIRST_OOM] = -1
    stats[Stat.ASKED] = stats[Stat.SAME_FROM] = stats[Stat.SAME_BELOW] = -1
    for k in (Stat.OOM_FREE, Stat.OOM_LARGEST, Stat.OOM_LIVE, Stat.OOM_RESERVED, Stat.OOM_ROUNDED):
        stats[k] = -1
    return stats


def capacity_for_state(trace: Trace) -> tuple[int, int]:
    """Starting sizes for the chunk and row matrices (they grow when needed)."""
    n = len(trace.events)
    return min(max(n // 4, 1024), 1 << 20), min(max(n // 8, 1024), 1 << 20)


NO_STATUS = np.zeros(0, np.int8)  # a run's ``status`` where its per-event outputs are not wanted
NO_STATUS.flags.writeable = False
NO_VALUES = np.zeros(0, np.int64)  # a kernel's ``addr`` (a run's ``rounded``) where they are not wanted
NO_VALUES.flags.writeable = False


def work_arrays(n: int, per_event: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A pool kernel's per-event arrays for ``n`` events: (addr, status, blk). ``addr`` and ``status``
    are the run's outputs where ``per_event`` (fresh, zero); otherwise ``addr`` is empty (the
    kernel writes none) and ``status``, like ``blk`` always, is lent (``tracekit.sim.scratch``).
    Hand them back with ``given_back`` when the kernel has returned."""
    from tracekit.sim.scratch import WORK

    blk = WORK.take(n, np.int64, zeroed=False)
    if per_event:
        return np.zeros(n, np.int64), np.zeros(n, np.int8), blk
    return np.zeros(0, np.int64), WORK.take(n, np.int8, zeroed=True), blk  # writable: a kernel takes it


def given_back(status: np.ndarray, blk: np.ndarray, per_event: bool) -> None:
    """Hand back what ``work_arrays`` lent: ``blk``, and ``status`` unless it is the run's output."""
    from tracekit.sim.scratch import WORK

    if per_event:
        WORK.give(blk)
    else:
        WORK.give(status, blk)


def pack(
    addr: np.ndarray, status: np.ndarray, rounded: np.ndarray, R: np.ndarray, S: np.ndarray,
    stats: np.ndarray,
) -> PolicyRun:
    """Trim the row matrix and fill the counters kept in ``S`` into ``stats``."""
    k = int(S[Slot.NROWS])
    rows = R[:k]
    # Rows are emitted in event order, except starting-state rows of a trace whose
    # initial rows are not all at the front: a stable sort keeps emission order.
    if k > 1 and np.any(np.diff(rows[:, Row.BEFORE]) < 0):
        rows = rows[np.argsort(rows[:, Row.BEFORE], kind="stable")]
    stats[Stat.PEAK_LIVE] = S[Slot.PEAK_LIVE]
    stats[Stat.PEAK_RESERVED] = S[Slot.PEAK_RES]
    stats[Stat.SEGMENT_ALLOCS] = S[Slot.SEGA]
    stats[Stat.SEGMENT_FREES] = S[Slot.SEGF]
    return PolicyRun(
        addr=addr.view(np.uint64),
        status=status,
        rows_before=np.ascontiguousarray(rows[:, Row.BEFORE]),
        rows_op=rows[:, Row.OP].astype(np.int8),
        rows_addr=np.ascontiguousarray(rows[:, Row.ADDR]).view(np.uint64),
        rows_size=np.ascontiguousarray(rows[:, Row.SIZE]).view(np.uint64),
        rows_stream=np.ascontiguousarray(rows[:, Row.STREAM]).view(np.uint64),
        stats=stats,
        rounded=rounded.view(np.uint64),
    )
