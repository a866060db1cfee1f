"""What the page needs to rebuild the allocator's state at an event: blocks, segments, events, keyframes.

A block is a malloc row and its paired free (``Trace.mate``), a segment a
``segment_alloc`` and its ``segment_free``; both are tables indexed by id. The kept
events say, per event, which block or segment they open or close (``ref``). The page
rebuilds the state *after* event ``k`` (as the analyzer's timeline reports it): start
from the keyframe of the window holding ``k`` (what is live just before the window's
first event) and apply the window's events up to ``k``.

Up to ``MAX_EVENTS`` events every event is kept (one window from 0, empty keyframe).
Past that the page keeps windows of events around the peaks, every OOM and
``EVEN`` evenly spaced points, ``WINDOW_BUDGET`` events in all, each with its keyframe;
the block table then holds the blocks opened or closed inside a window or live at a
keyframe. Everything is NumPy over whole columns.
"""

from __future__ import annotations

import numpy as np

from tracekit.report.page.columns import column
from tracekit.report.page.model import Blocks, EventColumns, Keyframes, Segments, State, Window
from tracekit.trace import Op, Trace

MAX_EVENTS = 1_000_000  # every event kept up to here
WINDOW_BUDGET = 400_000  # events kept in all past MAX_EVENTS
EVEN = 64  # evenly spaced windows past MAX_EVENTS
MIN_WINDOW = 64  # events per window, at least (so many OOMs cannot blow the budget up)
MAX_OOM_WINDOWS = 1024  # OOM windows past this many OOMs are merged into their neighbours' budget


def _ends(trace: Trace, idx: np.ndarray) -> np.ndarray:
    """The paired closing event of each opening row ``idx`` (-1: never closed)."""
    m = trace.mate[idx]
    return np.where(m >= 0, m, -1).astype(np.int64)


def segment_of(
    b_addr: np.ndarray,
    b_at: np.ndarray,
    s_addr: np.ndarray,
    s_size: np.ndarray,
    s_at: np.ndarray,
    s_end: np.ndarray,
    n: int,
) -> np.ndarray:
    """The segment holding each block when it was malloc'd (-1 none).

    Segments sorted by (address, alloc index); for a block at address ``a`` malloc'd at
    event ``m`` the candidate is the last segment whose address is the largest ``<= a``
    and whose alloc came before ``m``: key = rank(address) * 2^40 + alloc index, searched
    with rank(largest segment address <= a) * 2^40 + m. The candidate is kept when it
    covers ``a`` and is still live at ``m``.
    """
    if len(s_addr) == 0 or len(b_addr) == 0:
        return np.full(len(b_addr), -1, np.int32)
    order = np.lexsort((s_at, s_addr))
    ua, rank = np.unique(s_addr[order], return_inverse=True)
    key = rank.astype(np.uint64) * np.uint64(1 << 40) + s_at[order].astype(np.uint64)
    g = np.searchsorted(ua, b_addr, side="right").astype(np.int64) - 1
    q = np.maximum(g, 0).astype(np.uint64) * np.uint64(1 << 40) + b_at.astype(np.uint64)
    c = np.searchsorted(key, q, side="right") - 1
    c = np.clip(c, 0, len(order) - 1)
    seg = order[c]
    end = np.where(s_end[seg] >= 0, s_end[seg], n)
    ok = (
        (g >= 0)
        & (s_addr[seg] <= b_addr)
        & (b_addr < s_addr[seg] + s_size[seg])
        & (s_at[seg] < b_at)
        & (end > b_at)
    )
    return np.where(ok, seg, -1).astype(np.int32)


def windows(n: int, centres: list[tuple[int, str]]) -> list[tuple[int, int, str]]:
    """Windows ``[start, end)`` around each centre, widths sharing ``WINDOW_BUDGET``; overlaps merged.

    A trace of up to ``MAX_EVENTS`` events is one window ``[0, n)``.
    """
    if n <= MAX_EVENTS:
        return [(0, n, "all")]
    width = max(MIN_WINDOW, WINDOW_BUDGET // max(len(centres), 1))
    spans = sorted((max(0, c - width // 2), min(n, c - width // 2 + width), why) for c, why in centres)
    out: list[tuple[int, int, str]] = []
    for s, e, why in spans:
        if out and s <= out[-1][1]:
            ps, pe, pwhy = out[-1]
            out[-1] = (ps, max(pe, e), pwhy if why in pwhy else f"{pwhy}, {why}")
        else:
            out.append((s, e, why))
    return out


def centres(n: int, peaks: list[int | None], oom_index: np.ndarray) -> list[tuple[int, str]]:
    """Where windows go past ``MAX_EVENTS``: the peaks, every OOM (at most ``MAX_OOM_WINDOWS``), evenly."""
    out = [(int(p), "peak") for p in peaks if p is not None]
    if len(oom_index) > MAX_OOM_WINDOWS:
        oom_index = oom_index[np.linspace(0, len(oom_index) - 1, MAX_OOM_WINDOWS).astype(np.int64)]
    out += [(int(k), "OOM") for k in oom_index]
    out += [(int(k), "even") for k in np.linspace(0, n - 1, EVEN).astype(np.int64)]
    return out


def live_at(start: np.ndarray, end: np.ndarray, n: int, ks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each keyframe ``ks[j]`` (ascending), the ids opened before it and not closed before it:
    ``ids[at[j]:at[j + 1]]`` (ascending).

    Id ``b`` (opened at ``start[b]``, closed at ``end[b]``, -1 never, i.e. at ``n``) is live just
    before event ``k`` iff ``start[b] < k <= end[b]``: the keyframes ``j`` in
    ``[searchsorted(ks, start, right), searchsorted(ks, end, right))``. Every (id, keyframe) pair
    is expanded with ``repeat`` and grouped by keyframe: O(ids log K + output), no per-keyframe scan.
    """
    endp = np.where(end >= 0, end, n)
    lo = np.searchsorted(ks, start, side="right")
    count = np.maximum(np.searchsorted(ks, endp, side="right") - lo, 0)
    total = int(count.sum())
    ids = np.repeat(np.arange(len(start)), count)
    first = np.repeat(np.cumsum(count) - count, count)
    kf = np.repeat(lo, count) + (np.arange(total) - first)
    order = np.argsort(kf, kind="stable")  # ids stay ascending within each keyframe
    at = np.concatenate(([0], np.cumsum(np.bincount(kf, minlength=len(ks)))))
    return ids[order], at


def oom_ids(seq: np.ndarray, oom_seq: np.ndarray) -> np.ndarray:
    """The OOM id (row in ``oom_seq``, ascending) of each oom row whose seq is ``seq``; -1 if absent."""
    if len(oom_seq) == 0:
        return np.full(len(seq), -1, np.int64)
    j = np.minimum(np.searchsorted(oom_seq, seq), len(oom_seq) - 1)
    return np.where(oom_seq[j] == seq, j, -1)


def build_state(trace: Trace, stack: np.ndarray, peaks: list[int | None], oom_seq: np.ndarray) -> State:
    """The state tables of ``trace`` (one device); ``stack``: the stack id of each of its events (-1 none);
    ``oom_seq``: every OOM's seq, ascending (ids = rows)."""
    ev = trace.events
    n = len(ev)
    t0 = int(ev.t_ns[0]) if n else 0
    bi = np.flatnonzero(ev.op == Op.MALLOC)
    si = np.flatnonzero(ev.op == Op.SEGMENT_ALLOC)
    bend, send = _ends(trace, bi), _ends(trace, si)
    oi = np.flatnonzero(ev.op == Op.OOM)
    wins = windows(n, centres(n, peaks, oi))
    in_win = np.zeros(n + 1, bool)
    for s, e, _ in wins:
        in_win[s:e] = True
    ks = np.array([w[0] for w in wins], np.int64)
    (key_b, b_at), (key_s, s_at) = live_at(bi, bend, n, ks), live_at(si, send, n, ks)
    keep_b = in_win[bi] | in_win[np.where(bend >= 0, bend, n)]
    keep_b[key_b] = True
    new_id = np.cumsum(keep_b) - 1
    bsel = np.flatnonzero(keep_b)
    kept = np.flatnonzero(in_win[:n])
    ref = np.full(n, -1, np.int64)
    ref[bi] = np.where(keep_b, new_id, -1)
    closed = bend >= 0
    ref[bend[closed]] = np.where(keep_b[closed], new_id[closed], -1)
    ref[si] = np.arange(len(si))
    ref[send[send >= 0]] = np.flatnonzero(send >= 0)
    ref[oi] = oom_ids(ev.seq[oi], oom_seq)
    window_list = [Window(start=s, end=e, reason=why) for s, e, why in wins]
    keyframes = Keyframes(
        blocks=column(new_id[key_b], "i32"),
        block_at=column(b_at, "i32", delta=True),
        segments=column(key_s, "i32"),
        segment_at=column(s_at, "i32", delta=True),
    )
    return State(
        complete=len(wins) == 1 and wins[0][0] == 0 and wins[0][1] == n,
        kept=len(kept),
        note=_note(n, len(kept), wins),
        blocks=_blocks(trace, stack, bi[bsel], bend[bsel], si, send, t0),
        segments=_segments(trace, si, send, t0),
        events=EventColumns(
            index=column(kept, "i32", delta=True),
            op=column(ev.op[kept], "u8"),
            ref=column(ref[kept], "i32"),
            seq=column(ev.seq[kept].astype(np.float64), "f64", delta=True),
            t_ns=column((ev.t_ns[kept] - t0).astype(np.float64), "f64", delta=True),
        ),
        windows=window_list,
        keyframes=keyframes,
        pooled=len(si) > 0,
    )


def _opt(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """``values[at]`` where ``at >= 0``, else -1 (float64)."""
    return np.where(at >= 0, values[np.maximum(at, 0)].astype(np.float64), -1.0)


def _blocks(
    trace: Trace,
    stack: np.ndarray,
    bi: np.ndarray,
    bend: np.ndarray,
    si: np.ndarray,
    send: np.ndarray,
    t0: int,
) -> Blocks:
    ev = trace.events
    seg = segment_of(ev.addr[bi], bi, ev.addr[si], ev.size[si], si, send, len(ev))
    t = ev.t_ns.astype(np.int64) - t0
    return Blocks(
        addr=column(ev.addr[bi].astype(np.float64), "f64"),
        size=column(ev.size[bi].astype(np.float64), "f64"),
        rounded=column(ev.rounded[bi].astype(np.float64), "f64"),
        stack=column(stack[bi], "i32"),
        segment=column(seg, "i32"),
        malloc=column(bi, "i32", delta=True),
        free=column(bend, "i32"),
        malloc_seq=column(ev.seq[bi].astype(np.float64), "f64", delta=True),
        free_seq=column(_opt(ev.seq, bend), "f64"),
        malloc_t=column(t[bi].astype(np.float64), "f64", delta=True),
        free_t=column(_opt(t, bend), "f64"),
    )


def _segments(trace: Trace, si: np.ndarray, send: np.ndarray, t0: int) -> Segments:
    ev = trace.events
    t = ev.t_ns.astype(np.int64) - t0
    return Segments(
        addr=column(ev.addr[si].astype(np.float64), "f64"),
        size=column(ev.size[si].astype(np.float64), "f64"),
        alloc=column(si, "i32"),
        free=column(send, "i32"),
        alloc_seq=column(ev.seq[si].astype(np.float64), "f64"),
        free_seq=column(_opt(ev.seq, send), "f64"),
        alloc_t=column(t[si].astype(np.float64), "f64"),
        free_t=column(_opt(t, send), "f64"),
    )


def _note(n: int, kept: int, wins: list[tuple[int, int, str]]) -> str:
    if kept == n:
        return f"The allocator state can be shown at every one of the {n:,} events."
    return (
        f"The trace has {n:,} events; the page keeps {kept:,} of them in {len(wins)} windows (around "
        f"the peaks, every OOM and evenly spaced points), each starting from a keyframe of what was "
        f"live. The state is shown at any event inside a window; elsewhere at the nearest window."
    )
