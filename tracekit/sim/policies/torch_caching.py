"""``torch``: PyTorch's CUDA caching allocator (2.x ``CUDACachingAllocator``) as a simulated allocator.

Small (<= 1 MiB after ``round_size``) and large pools that never share memory;
segments of 2 MiB, 20 MiB or the request rounded up to 2 MiB; best fit per
(stream, size, address); PyTorch's split and ``max_split_size`` rules; merge on
free; on a miss, release of cached blocks and a retry before OOM.
``SimConfig.capacity`` is the per-process limit (memory fraction x device
total): a segment that would take reserved bytes over it fails without a
device call. ``SimConfig.options`` takes PyTorch's allocator keys
(``max_split_size_mb``, ``roundup_power2_divisions``, ``expandable_segments``,
``max_non_split_rounding_mb``) and ``release_points`` (see ``tracekit.sim.torch_rules``).
Rows marked ``initial`` (the state a snapshot's ring buffer starts from) are
loaded first at their recorded addresses; new segments get invented addresses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

import numpy as np

from tracekit.errors import InputError, UsageError
from tracekit.sim.base import Allocator, Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import (
    NO_REFUSAL,
    Kind,
    Op,
    Reserve,
    Slot,
    Stat,
    TorchPool,
    TorchSetting,
    named_vector,
)
from tracekit.sim.codes import Reservation as X_
from tracekit.sim.torch_rules import (
    MIB,
    TorchSettings,
    options_from_snapshot,
    round_sizes,
    segment_sizes,
    settings,
)
from tracekit.sim.trace_cache import TraceCache
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Source

if TYPE_CHECKING:
    from tracekit.sim.prepare import ReplayInput


def prepare_input(trace: Trace) -> ReplayInput:
    """``tracekit.sim.prepare.prepare`` (imported on use: the registry imports this module)."""
    from tracekit.sim.prepare import prepare

    return prepare(trace)


_P = TypeVar("_P")  # a part of ``_Setup``
assert TorchPool.SMALL == 1 and TorchPool.LARGE == 0  # _pools counts on it
LARGE_PAGE = 20 * MIB  # expandable segments map the large pool in 20 MiB pages
SMALL_PAGE = 2 * MIB
DEFAULT_TOTAL = 1 << 40  # device size assumed for reservations when the trace names none


def _pools(trace: Trace, inp: ReplayInput, rounded: np.ndarray) -> np.ndarray:
    """The ``TorchPool`` of every event.

    Requests go by their rounded size. An initial segment is small when the
    trace says so (an extra ``segment_type`` column) or else when it is a
    2 MiB segment (large segments are >= 10 MiB), or, for a mapped range of an
    expandable segment, when it is not a multiple of the 20 MiB large page;
    initial blocks take the pool of the initial segment that holds them.
    """
    ev = trace.events
    init = inp.initial
    pool = (rounded <= MIB).astype(np.int64)  # TorchPool.SMALL is 1, LARGE 0: no np.where copy
    segs = np.flatnonzero(init & (ev.op == Op.SEGMENT_ALLOC))
    if len(segs) == 0:
        return pool
    size = ev.size[segs].astype(np.int64)
    small = (size <= 2 * MIB) | (inp.expandable[segs] & (size % LARGE_PAGE != 0))
    given = inp.segment_small[segs]
    small = np.where(given >= 0, given == 1, small)
    pool[segs] = np.where(small, TorchPool.SMALL, TorchPool.LARGE)
    blocks = np.flatnonzero(init & (ev.op == Op.MALLOC))
    if len(blocks):
        order = np.argsort(ev.addr[segs])
        starts = ev.addr[segs][order]
        k = np.searchsorted(starts, ev.addr[blocks], side="right") - 1
        kk = np.maximum(k, 0)
        inside = (k >= 0) & (ev.addr[blocks] < starts[kk] + ev.size[segs][order][kk])
        pool[blocks[inside]] = np.where(small[order][k[inside]], TorchPool.SMALL, TorchPool.LARGE)
    return pool


def _gc_threshold(config: SimConfig, st: TorchSettings) -> int:
    """Bytes above which cached blocks are garbage-collected: threshold x the per-process limit.

    PyTorch collects only when a memory fraction is set (here: a capacity).
    """
    if not config.capacity or st.garbage_collection_threshold <= 0.0:
        return 0
    return max(int(st.garbage_collection_threshold * config.capacity), 1)


def _cfg(config: SimConfig, st: TorchSettings, n_streams: int) -> np.ndarray:
    return named_vector(TorchSetting, {
        TorchSetting.CAPACITY: config.capacity or 0, TorchSetting.DEVICE_TOTAL: config.device_total or 0,
        TorchSetting.MAX_SPLIT: st.max_split_size, TorchSetting.MAX_NON_SPLIT: st.max_non_split_rounding,
        TorchSetting.EXPANDABLE: st.expandable_segments, TorchSetting.GC_THRESHOLD: _gc_threshold(config, st),
        TorchSetting.STREAMS: n_streams, TorchSetting.CONTINUE: config.continue_on_oom,
    })


def _reservations(trace: Trace, config: SimConfig, n_streams: int) -> np.ndarray:
    """Expandable-segment table: page size and virtual size per group (large pool first).

    PyTorch reserves page-size x ceil(9/8 x device total / page-size) bytes.
    """
    dev = trace.meta.device
    total = config.device_total or (dev.total_bytes if dev and dev.total_bytes else DEFAULT_TOTAL)
    X = np.zeros((2 * n_streams, len(X_)), dtype=np.int64)
    for rows, page in ((slice(0, n_streams), LARGE_PAGE), (slice(n_streams, None), SMALL_PAGE)):
        X[rows, X_.PAGE] = page
        X[rows, X_.VSIZE] = -(-(total + total // 8) // page) * page
    return X


class _Setup:
    """What every replay of one trace shares whatever the setting (``_setup``): each part is
    computed on first use and kept for the trace's lifetime, keyed by the few settings it
    depends on (the rounding divisions, whether handled attempts stop the replay, whether
    recorded releases and addresses are followed). Arrays the kernel writes are copied out. It
    holds no reference to the trace (the cache's key): each method is given it.

    Advise's threads share one setup. Each part is made once (``_once``), and a thread making
    one part holds up only the threads that want that part: three rounding settings tried side
    by side size the trace at the same time, not one after another."""

    def __init__(self, trace: Trace) -> None:
        from tracekit.sim.pool_run import next_address
        from tracekit.sim.prepare import prepare

        self.inp = prepare(trace)
        self.next_address = next_address(trace, self.inp.initial, LARGE_PAGE)
        self._parts: dict[tuple[str, object], object] = {}
        self._making: dict[tuple[str, object], threading.Lock] = {}
        self._lock = threading.Lock()  # guards the two tables; no part is made while it is held

    def _once(self, key: tuple[str, object], make: Callable[[], _P]) -> _P:
        """The part ``key``, made by ``make`` on first use, once whatever the threads asking."""
        with self._lock:
            if key in self._parts:
                return self._parts[key]  # type: ignore[return-value]
            gate = self._making.setdefault(key, threading.Lock())
        with gate:  # one thread makes it; the others asking for it wait here, then take it
            with self._lock:
                if key in self._parts:
                    return self._parts[key]  # type: ignore[return-value]
            value = make()
            with self._lock:
                self._parts[key] = value
                del self._making[key]
            return value

    def kinds(self, stop_at_first_oom: bool) -> np.ndarray:
        from tracekit.sim.prepare import attempt_kinds

        return self._once(("kinds", stop_at_first_oom), lambda: attempt_kinds(self.inp, stop_at_first_oom))

    def sized(self, trace: Trace, divisions: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(rounded size, group) per event under ``divisions`` (int64 both). The groups are the
        same under every ``divisions``: a request's pool is the small one when its rounded size
        is at most 1 MiB, and the division rule rounds a request of at most 1 MiB up to at most
        the power of two above it, so never past 1 MiB, and one above 1 MiB never below its
        512-byte rounding (``tests/unit/test_torch_rounding.py`` holds this)."""
        plain = _plain(divisions)
        return self._once(("sized", plain), lambda: self._size(trace, plain))

    def _size(self, trace: Trace, divisions: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        # In place where NumPy allows: each array of a 10M-event trace is 80 MB of fresh pages.
        from tracekit.sim.policies._torch_kernel import round_sizes as compiled_round_sizes

        inp, ev = self.inp, trace.events
        rounded = compiled_round_sizes(inp.size, np.asarray(divisions, dtype=np.uint64))
        # A live block at the start keeps the size PyTorch gave it (slack included).
        start = np.flatnonzero(inp.initial)
        held = start[(ev.op[start] == Op.MALLOC) & (ev.rounded[start] > 0)]
        rounded[held] = ev.rounded[held].view(np.int64)
        if divisions:  # the groups are those of the plain rounding (see ``sized``): shared, not made again
            return rounded, self.sized(trace, ())[1]
        group = _pools(trace, inp, rounded)
        group *= len(inp.streams)
        group += inp.stream_index
        return rounded, group

    def reported(self, trace: Trace, divisions: tuple[int, ...], stop_at_first_oom: bool) -> np.ndarray:
        """The rounded sizes a run reports per event (its ``PolicyRun.rounded``): a request's
        rounded size, 0 on rows the replay does not place."""
        def make() -> np.ndarray:
            rounded = self.sized(trace, divisions)[0]
            kind = self.kinds(stop_at_first_oom)
            return np.where((kind == Kind.ALLOC) | (kind == Kind.TRY), rounded, 0)

        return self._once(("reported", (_plain(divisions), stop_at_first_oom)), make)

    def releases(self, trace: Trace, at_trace_frees: bool) -> tuple[np.ndarray, np.ndarray]:
        """``retry_releases`` (``at_trace_frees``), or none: (release before the row, bytes refused)."""
        from tracekit.sim.pool_run import retry_releases

        def make() -> tuple[np.ndarray, np.ndarray]:
            n = len(trace.events)
            if not at_trace_frees:
                return np.zeros(n, np.bool_), np.zeros(n, np.int64)
            return retry_releases(trace.events.op, self.inp.size, self.inp.initial)

        return self._once(("releases", at_trace_frees), make)

    def hints(self, trace: Trace, recorded_addresses: bool) -> np.ndarray:
        """``address_hints``, a fresh copy (the kernel marks the hints it takes)."""
        from tracekit.sim.pool_run import address_hints

        return self._once(("hints", recorded_addresses),
                          lambda: address_hints(trace, self.inp.initial, recorded_addresses)).copy()


def _plain(divisions: tuple[int, ...]) -> tuple[int, ...]:
    """``divisions`` as a key: () where none divides (every entry 0 or 1, as unset), as the kernel
    reads them (``round_sizes``: a table with no entry above 1 rounds to 512 bytes alone)."""
    return divisions if any(d > 1 for d in divisions) else ()


# Setups kept at once: advise's prepared trace, which every setting replays, stays (least recently
# used dropped first) while the traces each counterfactual round makes come and go.
_SETUPS: TraceCache[_Setup] = TraceCache(keep=4)


def _setup(trace: Trace) -> _Setup:
    """The ``_Setup`` of ``trace``, made once per trace (``tracekit.sim.trace_cache``)."""
    return _SETUPS.get(trace, _Setup)


class TorchCaching:
    """PyTorch's CUDA caching allocator for one device."""

    name: ClassVar[str] = "torch"
    description: ClassVar[str] = (
        "PyTorch CUDACachingAllocator: small/large pools, 2/20 MiB segments, best fit per stream, "
        "split rules, release and retry before OOM; max_split_size_mb, roundup_power2_divisions, "
        "expandable_segments via --torch-conf"
    )
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.POOL, recorded_limit=True, rank=6,
                                                 reproduces=Source.TORCH,
                                                 models=Allocator.TORCH)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        return self.run_with_state(trace, config)[0]

    def run_with_state(self, trace: Trace, config: SimConfig) -> tuple[PolicyRun, np.ndarray, np.ndarray]:
        """The run, plus the final chunk store and counters (for consistency checks)."""
        # Compiled, on first use (the registry's convention: importing a policy module loads no kernel).
        from tracekit.sim import chunks as ck
        from tracekit.sim.policies._torch_kernel import torch_replay
        from tracekit.sim.pool_run import (
            NO_STATUS,
            NO_VALUES,
            capacity_for_state,
            given_back,
            pack,
            pool_stats,
            work_arrays,
        )
        from tracekit.sim.prepare import holders, prepare

        st = settings(with_recorded_settings(trace, config.options))
        ev = trace.events
        inp = prepare(trace)
        streams, ns = inp.streams, len(inp.streams)
        init = inp.initial
        setup = _setup(trace)
        rounded, group = setup.sized(trace, st.roundup_power2_divisions)
        rel, retry = setup.releases(trace, st.release_at_trace_frees)
        hints = setup.hints(trace, st.recorded_addresses)
        X = _reservations(trace, config, ns)
        init_exp = init & inp.expandable & (ev.op == Op.SEGMENT_ALLOC)
        if st.expandable_segments and init_exp.any():
            # Recorded mapped ranges: each group's segment starts at its lowest one.
            rows = np.flatnonzero(init_exp)
            for g in np.unique(group[rows]):
                X[g, X_.BASE] = int(ev.addr[rows[group[rows] == g]].min())
                X[g, X_.MADE] = Reserve.AT_BASE
        cfg = _cfg(config, st, ns)
        cap, rows_cap = capacity_for_state(trace)
        C, R, S = ck.new_state(cap, rows_cap, setup.next_address)
        stats = pool_stats()
        kind = setup.kinds(config.stop_at_first_oom)
        n = len(ev)
        addr, status, blk = work_arrays(n, config.per_event)
        try:
            C, R = torch_replay(
                ev.op, kind, inp.replaced_by, holders(inp), inp.size, rounded, group, trace.mate, init,
                init_exp, ev.addr.view(np.int64), rel, retry, hints, np.tile(streams, 2).view(np.int64), cfg,
                C, R, S, X, stats, addr, status, blk,
            )
        finally:
            given_back(status, blk, config.per_event)
        status = status if config.per_event else NO_STATUS
        # The capacity enters the kernel only in _alloc_block's limit test, and in collecting
        # garbage (a threshold x the capacity, none without one): without a threshold, a capacity
        # at or above every sum that test saw replays this run step by step.
        # Likewise this run is the one at every capacity that its passed tests fit and its refused
        # ones do not: from the most it let through up to the least it refused.
        if st.garbage_collection_threshold <= 0.0:
            stats[Stat.ASKED] = S[Slot.ASKED]
            stats[Stat.SAME_FROM] = S[Slot.PASSED]
            stats[Stat.SAME_BELOW] = S[Slot.REFUSED] if S[Slot.REFUSED] > 0 else NO_REFUSAL
        reported = (setup.reported(trace, st.roundup_power2_divisions, config.stop_at_first_oom)
                    if config.per_event else NO_VALUES)
        return pack(addr, status, reported, R, S, stats), C, S


@dataclass(frozen=True)
class InertFacts:
    """What ``inert_keys`` reads of a trace, whatever the setting (bytes)."""

    biggest_request: int  # the largest malloc or oom request, 0 for none
    biggest_start_segment: int  # the largest segment of the starting state, 0 for none
    starts_outside_expandable: bool  # a starting segment that is not an expandable one


def inert_facts(trace: Trace) -> InertFacts:
    """The trace's side of ``inert_keys``: read once per trace by a caller asking for many settings."""
    inp = prepare_input(trace)
    ev = trace.events
    req = (ev.op == Op.MALLOC) | (ev.op == Op.OOM)
    start = inp.initial & (ev.op == Op.SEGMENT_ALLOC)
    return InertFacts(int(inp.size[req].max()) if req.any() else 0,
                      int(ev.size[start].max()) if start.any() else 0,
                      bool((start & ~inp.expandable).any()))


def may_be_inert(options: Mapping[str, str]) -> bool:
    """Whether ``inert_keys`` can drop a key of ``options`` on some trace: the trace need not be read
    (``inert_facts``) for a setting where this is False."""
    st = settings(options)
    return (("max_split_size_mb" in options and not st.expandable_segments)
            or ("garbage_collection_threshold" in options and st.expandable_segments))


def inert_keys(trace: Trace, options: Mapping[str, str], facts: InertFacts | None = None) -> frozenset[str]:
    """The keys of ``options`` that the model provably ignores on ``trace``: replaying it with them
    and without them makes every step alike (``options`` as the whole setting: a prepared
    recording's, whose recorded settings are dropped). Two rules, read off ``_torch_kernel``:

    - ``max_split_size_mb`` M without expandable segments, when no block the model can hold
      reaches M. M enters the kernel only as "a block >= M" tests in ``_find`` (never true then),
      the split rule ``s < M`` (true for every request then, as it is unset) and
      ``_release_available`` (which finds no cached block >= M, releases nothing and fails, so
      ``release_cached`` follows, as it does unset). A block lies in one segment: a starting
      segment of the trace, or one ``segment_size(s)`` for a rounded request s, at most 20 MiB
      below s = 10 MiB and the request rounded up to 2 MiB above (increasing in s, as
      ``round_size`` is); M > 20 MiB (``settings``), so the largest request's segment and the
      largest starting segment bound every block against M.
    - ``garbage_collection_threshold`` with expandable segments, when the trace starts with no
      segment outside them. ``_garbage_collect`` releases only unsplit pieces on the
      whole-allocation list, where ``insert_free`` puts no piece of an expandable segment, and
      with expandable segments every new segment is one (``_alloc_block``): the list stays
      empty, so collecting frees nothing; its lookup counter is read by collecting alone.
    """
    if not may_be_inert(options):
        return frozenset()
    st = settings(options)
    f = inert_facts(trace) if facts is None else facts
    out = set()
    if "max_split_size_mb" in options and not st.expandable_segments:
        biggest = np.array([f.biggest_request], np.int64)
        block = int(segment_sizes(round_sizes(biggest, st.roundup_power2_divisions))[0])
        if max(block, f.biggest_start_segment) < st.max_split_size:
            out.add("max_split_size_mb")
    gc = "garbage_collection_threshold" in options
    if gc and st.expandable_segments and not f.starts_outside_expandable:
        out.add("garbage_collection_threshold")
    return frozenset(out)


def with_recorded_settings(trace: Trace, options: Mapping[str, str]) -> dict[str, str]:
    """The allocator settings the trace was recorded with, overridden by explicit options.

    An imported snapshot stores PyTorch's ``allocator_settings``; replaying it
    under the settings it ran with is what a user means by default.
    """
    try:  # the file's settings are input, not usage: a bad one is the file's fault (exit 1)
        base = options_from_snapshot(trace.meta.recorded.torch_settings.snapshot)
        settings(base)
    except (UsageError, TypeError, ValueError, OverflowError) as e:
        raise InputError(
            f"{trace.path}: the recorded PyTorch allocator settings are not usable ({e})") from None
    return {**base, **options}


MODEL = TorchCaching()
