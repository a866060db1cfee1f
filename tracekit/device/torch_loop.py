"""The timed replay loop through PyTorch's caching allocator, and its history turned into rows.

``TorchLoop`` works like the other loops (``tracekit.device.loops``): spans of
at most ``CHUNK`` events as Python lists, two ``perf_counter_ns`` reads and
three list stores around each ``raw_alloc(size, stream)``/``raw_delete(ptr)``,
``cudaMemGetInfo`` and a pending Ctrl-C/SIGTERM looked at every ``Loop.every``
requests. Where the trace shows the program releasing memory (the first of a
run of recorded ``segment_free`` rows) a span ends and ``empty_cache()`` runs,
as the ``torch`` model does with ``release_points:trace``. After each span,
and after each release, the allocator's history is harvested and attached:

- every replayed malloc leaves exactly one *closing* entry, ``alloc`` (placed)
  or ``oom`` (failed), in request order, and so does every free where the
  history records frees (``free_completed``; PyTorch versions with
  ``skip_actions`` leave them out). A request of 0 bytes leaves none
  (PyTorch returns a null pointer without recording anything);
- a free never moves device memory (no ``record_stream`` here), so each
  ``segment_alloc``/``segment_free`` entry of a span belongs to the request of
  the next closing entry and becomes a row inserted before it; those of a
  release go before the release point. ``segment_map``/``segment_unmap`` of
  expandable segments become one row per 2 MiB page, so every release pairs
  with a device allocation of its address.

A history whose closing entries do not match the replayed requests one for
one, or whose ``alloc`` addresses differ from the pointers returned, is a
DeviceError: the rows would be attached to the wrong requests.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.device.allocators import SegmentLog
from tracekit.device.loops import CHUNK, Loop, default_status
from tracekit.errors import DeviceError
from tracekit.importers import torch_columns as tc
from tracekit.sim.base import Status
from tracekit.trace.schema import Op

PAGE = 2 << 20  # bytes; expandable segments map whole 2 MiB pages (20 MiB in the large pool)
_CLOSING = np.array([tc.ALLOC, tc.FREE_COMPLETED, tc.OOM], np.int8)
_GROW = np.array([tc.SEGMENT_ALLOC, tc.SEGMENT_MAP], np.int8)
_SEGMENT = np.array([tc.SEGMENT_ALLOC, tc.SEGMENT_FREE, tc.SEGMENT_MAP, tc.SEGMENT_UNMAP], np.int8)


@dataclass(frozen=True, eq=False)
class HistoryRows:
    """Allocator rows of one harvest: input index they precede, v1 op, addr, size, stream handle."""

    before: np.ndarray
    op: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    mapped: np.ndarray  # bool: the row is a page of an expandable segment


def history_of(entries: list[Any]) -> tc.History:
    """A harvest's entry dicts as the snapshot importer's columns, reading only what the rows need.

    Action codes are the importer's (``torch_columns.ACTIONS``); addr, size and
    stream are read for segment and ``alloc`` entries only (two passes over the
    few, one over all), since a replay's history is read once per chunk of
    requests and must cost far less than the calls that made it.
    """
    code = tc.ACTIONS.get
    action = np.fromiter((code(e.get("action"), tc.SKIPPED) for e in entries), np.int8, len(entries))
    keep = action != tc.SKIPPED
    if not keep.all():
        entries = [e for e, k in zip(entries, keep.tolist(), strict=True) if k]
        action = action[keep]
    n = len(entries)
    addr, size, stream = np.zeros(n, np.uint64), np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    need = np.flatnonzero(np.isin(action, _SEGMENT) | (action == tc.ALLOC)).tolist()
    if need:
        addr[need] = [entries[i].get("addr") or 0 for i in need]
        size[need] = [entries[i].get("size") or 0 for i in need]
        stream[need] = [entries[i].get("stream") or 0 for i in need]
    none = np.full(n, -1, np.int64)
    return tc.History(action=action, addr=addr, size=size, stream=stream, time_us=none,
                      site=np.full(n, -1, np.int32), stack=np.full(n, -1, np.int32), device_free=none,
                      skipped=Counter(), has_time=False)


def closing_requests(ops: np.ndarray, status: np.ndarray, sizes: np.ndarray, mates: np.ndarray,
                     lo: int, hi: int, frees: bool = True, released: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Input indices in [lo, hi) that left a closing history entry, in order, and that entry's action.

    ``frees``: whether the history records frees (``free_completed``) at all. ``released``:
    handled attempts served and released at once (``Loop.released``): each left ``alloc``
    and then, where frees are recorded, ``free_completed``.
    """
    o, st = ops[lo:hi], status[lo:hi]
    alloc = (o == Op.MALLOC) | (o == Op.OOM)
    m = mates[lo:hi]
    freed_size = np.where(m >= 0, sizes[np.maximum(m, 0)], 0)
    rel = released[lo:hi] if released is not None else np.zeros(hi - lo, np.bool_)
    placed = ((st == Status.DONE) | rel) & alloc & (sizes[lo:hi] > 0)
    freed = (st == Status.DONE) & (o == Op.FREE) & (freed_size > 0) & frees
    failed = st == Status.OOM
    idx = np.flatnonzero(placed | freed | failed)
    action = np.where(placed[idx], tc.ALLOC, np.where(freed[idx], tc.FREE_COMPLETED, tc.OOM)).astype(np.int8)
    twice = np.flatnonzero(rel[idx] & placed[idx]) if frees else np.zeros(0, np.int64)
    if len(twice):  # the release's free_completed right after its alloc
        idx = np.insert(idx, twice + 1, idx[twice])
        action = np.insert(action, twice + 1, np.int8(tc.FREE_COMPLETED))
    return idx + lo, action


def attach(h: tc.History, requests: np.ndarray, actions: np.ndarray, after: int,
           addr: np.ndarray) -> HistoryRows:
    """The segment entries of ``h`` as rows before the requests they precede (``after``: past the last).

    ``requests``/``actions``: the replayed requests and the closing entry each must have left.
    """
    a = h.action
    closing = np.isin(a, _CLOSING)
    k = int(np.count_nonzero(closing))
    if k != len(requests) or not np.array_equal(a[closing], actions):
        raise DeviceError(f"PyTorch's memory history holds {k} allocations, frees and failures for "
                          f"{len(requests)} replayed requests, not in the same order; it cannot be matched")
    placed = requests[actions == tc.ALLOC]
    if not np.array_equal(h.addr[closing][actions == tc.ALLOC].astype(np.int64), addr[placed]):
        raise DeviceError("PyTorch's memory history names other addresses than the replayed allocations")
    seg = np.flatnonzero(np.isin(a, _SEGMENT))
    pos: np.ndarray = (np.cumsum(closing) - closing)[seg]
    nxt = np.append(requests, after).astype(np.int64)
    before = nxt[np.minimum(pos, k)]
    grow = np.isin(a[seg], _GROW)
    mapped = (a[seg] == tc.SEGMENT_MAP) | (a[seg] == tc.SEGMENT_UNMAP)
    size, start = h.size[seg].astype(np.int64), h.addr[seg].astype(np.int64)
    pages = np.where(mapped, np.maximum(size // PAGE, 1), 1)
    rep = np.repeat(np.arange(len(seg)), pages)
    first = np.repeat(np.cumsum(pages) - pages, pages)
    k_in = np.arange(len(rep)) - first
    is_page = mapped[rep]
    return HistoryRows(
        before=before[rep],
        op=np.where(grow[rep], Op.SEGMENT_ALLOC, Op.SEGMENT_FREE).astype(np.int8),
        addr=np.where(is_page, start[rep] + k_in * PAGE, start[rep]).astype(np.uint64),
        size=np.where(is_page, np.minimum(PAGE, size[rep]), size[rep]).astype(np.uint64),
        stream=h.stream[seg][rep].astype(np.int64),
        mapped=is_page,
    )


class TorchLoop:
    """The replay through ``backend`` (a ``TorchBackend``), with rows collected into ``log``."""

    def __init__(self, lp: Loop, backend: Any, log: SegmentLog) -> None:
        self.lp, self.backend, self.log = lp, backend, log
        self.mapped: list[bool] = []
        self.initial: list[bool] = []

    def take_initial(self, h: tc.History) -> None:
        """The segments made while rebuilding the starting state: rows before everything, marked initial."""
        seg = np.flatnonzero(np.isin(h.action, _SEGMENT))
        for i in seg.tolist():
            op = Op.SEGMENT_ALLOC if h.action[i] in _GROW else Op.SEGMENT_FREE
            self.log.add(0, op, int(h.addr[i]), int(h.size[i]), -1, 0, -1)
            self.log.stream.append(self.backend.recorded_stream(int(h.stream[i])))
            self.mapped.append(False)
            self.initial.append(True)

    def run(self, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray, handles: np.ndarray,
            release: np.ndarray) -> None:
        """Replay every event; ``handles``: stream per event; ``release``: empty_cache before it.

        The events run in spans that end at chunk boundaries and at release
        points; the history is harvested after each span and after each release,
        so a release's segment events go before the release point itself.
        """
        n = len(ops)
        ends = np.union1d(np.arange(CHUNK, n, CHUNK), np.flatnonzero(release))
        lo = 0
        for hi in [*ends[(ends > 0) & (ends < n)].tolist(), n]:
            stop = self._chunk(lo, hi, ops, sizes, mates, handles)
            self._harvest(lo, lo + stop if stop is not None else hi, ops, sizes, mates)
            if stop is not None:
                return
            if hi < n and release[hi]:
                self.backend.release_cached()
                self._harvest(hi, hi, ops, sizes, mates)
            lo = hi

    def _harvest(self, lo: int, hi: int, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray) -> None:
        lp, be = self.lp, self.backend
        h = be.harvest()
        frees = bool(np.any(h.action == tc.FREE_COMPLETED))  # PyTorch without skip_actions records them
        req, actions = closing_requests(ops, lp.status, sizes, mates, lo, hi, frees, lp.released)
        rows = attach(h, req, actions, hi, lp.addr.view(np.int64))
        last = int(lp.t_end[hi - 1]) if hi > 0 else 0
        for i in range(len(rows.before)):
            b = int(rows.before[i])
            # a row happened inside the call of the request it precedes: stamp it with that call's start
            t = int(lp.t_end[b] - max(int(lp.latency[b]), 0)) if b < hi and lp.t_end[b] > 0 else last
            self.log.add(b, Op(int(rows.op[i])), int(rows.addr[i]), int(rows.size[i]), -1, t, -1)
            self.log.stream.append(be.recorded_stream(int(rows.stream[i])))
            self.mapped.append(bool(rows.mapped[i]))
            self.initial.append(False)

    def _chunk(self, base: int, end: int, ops: np.ndarray, sizes: np.ndarray, mates: np.ndarray,
               handles: np.ndarray) -> int | None:
        """Events [base, end); returns how many ran when the replay stopped at an OOM, else None."""
        lp, be = self.lp, self.backend
        alloc, delete, oom_t = be.alloc, be.delete, be.oom_error
        clock, meminfo = time.perf_counter_ns, be.device_free
        live, every, standing, handled = lp.live, lp.every, lp.standing, lp.handled
        FREE, MALLOC, OOM = int(Op.FREE), int(Op.MALLOC), int(Op.OOM)
        S_OOM, S_SKIPPED, S_TRIED = int(Status.OOM), int(Status.SKIPPED), int(Status.TRIED)
        sl = slice(base, end)
        o_arr = ops[sl]
        o_l, s_l, m_l, h_l = o_arr.tolist(), sizes[sl].tolist(), mates[sl].tolist(), handles[sl].tolist()
        n = len(o_l)
        addr, t0l, t1l = [0] * n, [0] * n, [0] * n
        stat = default_status(o_arr)
        dfree: dict[int, int] = {}
        k = lp.k
        for j in range(n):
            o = o_l[j]
            try:
                if o == FREE:
                    p = live.pop(m_l[j], None)
                    if p is None:
                        stat[j] = S_SKIPPED  # its malloc failed (--continue-on-oom)
                        continue
                    t0 = clock()
                    delete(p)
                    t1 = clock()
                elif o == MALLOC or o == OOM:  # noqa: SIM109 - a tuple per event is slower
                    if standing and base + j in standing:  # a served attempt's block stands in for it
                        live[base + j] = addr[j] = standing.pop(base + j)
                        stat[j] = S_TRIED
                        continue
                    if o == OOM and lp.skip(base + j):
                        stat[j] = S_TRIED
                        continue
                    t0 = clock()
                    try:
                        p = alloc(s_l[j], h_l[j])
                    except oom_t as e:
                        t1l[j], t0l[j], stat[j] = clock(), t0, S_OOM
                        dfree[j] = meminfo()
                        if lp.note_oom(base + j, e, dfree[j], be.stats()):
                            lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                            return j + 1
                        continue
                    t1 = clock()
                    live[base + j] = p
                    if o == OOM and handled[base + j] and lp.served(base + j) is not None:
                        delete(p)  # nothing replaced it: released at once (history: alloc, then free)
                        stat[j] = S_TRIED
                        continue
                else:
                    continue  # segment rows: PyTorch's allocator makes its own
            except RuntimeError as e:
                lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j)
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise DeviceError(f"PyTorch's allocator failed at event {base + j}: {first}") from None
            addr[j] = p
            t0l[j] = t0
            t1l[j] = t1
            k -= 1
            if k == 0:
                k = every
                dfree[j] = meminfo()
                if lp.pending.signum:  # Ctrl-C / SIGTERM: stop here, where the live map is complete
                    lp.k = k
                    lp.flush(base, addr, t0l, t1l, stat, dfree, stop=j + 1)
                    lp.pending.check()
        lp.k = k
        lp.flush(base, addr, t0l, t1l, stat, dfree)
        return None
