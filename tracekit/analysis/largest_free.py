"""The largest free block over time: free gaps kept in a compiled max-tree over addresses.

Every address a trace touches is known up front, so block and segment
boundaries are coordinate-compressed (``tracekit.analysis.compress``) into
sorted positions p_0 < … < p_m−1, and each free gap ``[p_s, p_e)`` (a maximal
run of a live segment covered by no live block) is stored at its start
position: leaf s of a max-tree holds p_e − p_s, and a per-position record
holds the gap's end e (at s) and start s (at e). The max-tree gives the
largest free block at its root in O(1); each event changes at most three
gaps, each a point update that climbs only while the maximum changes:

- malloc ``[a, b)`` *carves* the gap containing it into ``[s, a)`` and
  ``[b, e)`` (the gap is found at ``a`` directly, else by a predecessor search
  down the tree);
- free ``[a, b)`` *releases* the range: it merges with the gap ending at ``a``
  and the gap starting at ``b``, except across a segment boundary (a position
  where a live segment starts), so a gap never spans two segments;
- segment_alloc releases its range (a new gap), segment_free carves it.

With ``merge_adjacent`` (PyTorch expandable segments, where adjacent mapped
ranges are one virtual segment) the boundary check is off. Blocks that lie in
no free gap (a trace that started mid-run) are ignored by the structure. A
segment freed while blocks in it are live (no real allocator does this) loses
its gaps at once, but the later free of such a block counts as free space.
Nothing is recomputed per event; the whole pass is one ``@njit`` loop that
also keeps the running live/requested/reserved sums and their peaks.

Every slot and column the kernels share is an IntEnum (``Stat``, ``FStat``,
``Probe``, ``Rec``), which numba reads as compile-time constants. The helpers
``scan`` calls once per event are inlined by numba (``inline="always"``).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.trace.schema import Op


class Stat(IntEnum):
    """Slots of the int64 ``stats`` array ``scan`` returns (bytes; ``*_IDX``: event index, -1 none)."""

    PEAK_LIVE = 0  # max over events of live (Σ rounded sizes of live blocks)
    PEAK_LIVE_IDX = 1  # first event at that maximum
    PEAK_REQ = 2  # max over events of requested (Σ requested sizes of live blocks)
    PEAK_REQ_IDX = 3
    RES_AT_PEAK_REQ = 4  # reserved after PEAK_REQ_IDX
    PEAK_RES = 5  # max over events of reserved (Σ live segments; live when the trace has none)
    PEAK_RES_IDX = 6
    REQ_AT_PEAK_RES = 7  # the most requested bytes among the events at peak reserved
    MIN_LFB_FREE = 8  # min largest free block over the events with free > 0 (-1: none)


class FStat(IntEnum):
    """Slots of the float64 ``fstats`` array: Σ over events, and Σ weighted by Δt (ns) to the next event."""

    SUM_RES = 0  # Σ_i reserved_i
    SUM_REQ = 1  # Σ_i requested_i
    MAX_FRAG = 2  # max_i (1 − largest free_i / free_i) over events with free_i > 0
    TSUM_RES = 3  # Σ_i reserved_i · Δt_i
    TSUM_REQ = 4  # Σ_i requested_i · Δt_i
    SUM_DT = 5  # Σ_i Δt_i, Δt_i = t_{i+1} − t_i where positive (else 0)


class Probe(IntEnum):
    """Columns of the int64 ``probed`` array: the state (bytes) after each probed event."""

    LIVE = 0
    REQ = 1
    RES = 2
    LFB = 3


class Rec(IntEnum):
    """Columns of the per-position record table (one row per position, so the facts about one
    address share a cache line)."""

    POS = 0  # the position's address
    GEND = 1  # end position of the gap starting here
    GSOE = 2  # start position of the gap ending here (-1: none)
    SEGS = 3  # how many live segments start here


N_STATS = len(Stat)
N_FSTATS = len(FStat)
N_PROBE = len(Probe)
RCOLS = len(Rec)
NONE = -1  # an index slot that holds no event or position

# The module-level names readers outside this module index with (``lf.PEAK_REQ``, ``lf.PROBE_RES``).
PEAK_LIVE, PEAK_LIVE_IDX, PEAK_REQ, PEAK_REQ_IDX = Stat.PEAK_LIVE, Stat.PEAK_LIVE_IDX, Stat.PEAK_REQ, \
    Stat.PEAK_REQ_IDX
RES_AT_PEAK_REQ, PEAK_RES, PEAK_RES_IDX = Stat.RES_AT_PEAK_REQ, Stat.PEAK_RES, Stat.PEAK_RES_IDX
REQ_AT_PEAK_RES, MIN_LFB_FREE = Stat.REQ_AT_PEAK_RES, Stat.MIN_LFB_FREE
SUM_RES, SUM_REQ, MAX_FRAG = FStat.SUM_RES, FStat.SUM_REQ, FStat.MAX_FRAG
TSUM_RES, TSUM_REQ, SUM_DT = FStat.TSUM_RES, FStat.TSUM_REQ, FStat.SUM_DT
PROBE_LIVE, PROBE_REQ, PROBE_RES, PROBE_LFB = Probe.LIVE, Probe.REQ, Probe.RES, Probe.LFB


# The max-tree is FAN-ary and implicit: node j's children are FAN·j + 1 … FAN·j + FAN (one
# 64-byte line of int64 once the array is aligned), its parent ⌊(j − 1) / FAN⌋, so an update
# climbs about log_FAN(m) levels, reading one cache line per level. Elsewhere ``size`` is the
# index of leaf 0 (leaf k is ``tree[size + k]``) and the root ``tree[0]`` is the maximum.
FAN_BITS = 3
FAN = 1 << FAN_BITS  # 8 int64 = one 64-byte cache line
LINE = 8  # int64 per 64-byte line: the alignment unit of the tree array
PAD = 2 * LINE  # spare elements allocated so the aligned view always fits


@plain(inline="always")
def _parent(j):  # pragma: no cover - compiled
    """⌊(j − 1) / FAN⌋ for j ≥ 1 (a shift: j is never negative)."""
    return (j - 1) >> FAN_BITS


@plain(inline="always")
def _first_child(p):  # pragma: no cover - compiled
    """FAN·p + 1: the first of node p's FAN children (and of their sibling group)."""
    return FAN * p + 1


@njit(cache=True)
def _new_tree(m):  # pragma: no cover - compiled
    """Zeroed tree with FAN^depth ≥ m leaves: (array, index of leaf 0 = Σ_{d<depth} FAN^d).

    The view starts so that every sibling group (indices FAN·p + 1 …) lands on a 64-byte line:
    index 1 is line-aligned, i.e. (address/8 + offset + 1) ≡ 0 (mod LINE).
    """
    leaves = 1
    first = 0
    while leaves < max(m, 1):
        first += leaves
        leaves *= FAN
    n = first + leaves
    raw = np.zeros(n + PAD, np.int64)
    base = raw.ctypes.data // 8  # the array's address in int64 units
    off = (LINE - 1 - base) % LINE
    return raw[off:off + n], first


@plain
def _set(tree, first, k, v):  # pragma: no cover - compiled
    """Leaf k := v; each ancestor := max of its children, climbing only while that changes."""
    j = first + k
    tree[j] = v
    while j > 0:
        p = _parent(j)
        c = _first_child(p)
        m = tree[c]
        for q in range(c + 1, c + FAN):
            if tree[q] > m:
                m = tree[q]
        if tree[p] == m:
            return
        tree[p] = m
        j = p


@plain
def _down(tree, first, j, rightmost):  # pragma: no cover - compiled
    """From node j, known to hold a gap, the rightmost (or leftmost) gap leaf below it."""
    while j < first:
        c = _first_child(j)
        if rightmost:
            q = c + FAN - 1
            while tree[q] <= 0:
                q -= 1
        else:
            q = c
            while tree[q] <= 0:
                q += 1
        j = q
    return j - first


@plain
def _pred(tree, first, k):  # pragma: no cover - compiled
    """max{leaf s ≤ k : tree holds a gap at s}, or NONE."""
    j = first + k
    if tree[j] > 0:
        return k
    while j > 0:
        c = _first_child(_parent(j))
        for q in range(j - 1, c - 1, -1):
            if tree[q] > 0:
                return _down(tree, first, q, True)
        j = _parent(j)
    return NONE


@plain
def _succ(tree, first, k):  # pragma: no cover - compiled
    """min{leaf s ≥ k : tree holds a gap at s}, or NONE."""
    j = first + k
    if tree[j] > 0:
        return k
    while j > 0:
        c = _first_child(_parent(j))
        for q in range(j + 1, c + FAN):
            if tree[q] > 0:
                return _down(tree, first, q, False)
        j = _parent(j)
    return NONE


@njit(cache=True)
def _new_records(pos):  # pragma: no cover - compiled
    """The record table for positions ``pos``: POS filled, no gap ending anywhere, no segment."""
    m = pos.shape[0]
    R = np.zeros((max(m, 1), RCOLS), np.int64)
    for k in range(m):
        R[k, Rec.POS] = pos[k]
        R[k, Rec.GSOE] = NONE
    return R


@plain
def _add_gap(tree, size, R, s, e):  # pragma: no cover - compiled
    """Record the gap [s, e) of length p_e − p_s bytes (nothing when empty)."""
    length = R[e, Rec.POS] - R[s, Rec.POS]
    if length > 0:
        R[s, Rec.GEND] = e
        R[e, Rec.GSOE] = s
        _set(tree, size, s, length)


@plain
def _drop_gap(tree, size, R, s):  # pragma: no cover - compiled
    """Forget the gap starting at s."""
    R[R[s, Rec.GEND], Rec.GSOE] = NONE
    _set(tree, size, s, 0)


@plain
def _carve(tree, size, R, a, b):  # pragma: no cover - compiled
    """Take [a, b) out of the gap [s, e) holding it, leaving [s, a) and [b, e); False if no gap
    holds all of it."""
    s = a if tree[a + size] > 0 else _pred(tree, size, a)
    if s < 0 or R[s, Rec.GEND] < b:
        return False
    e = R[s, Rec.GEND]
    _drop_gap(tree, size, R, s)
    if s < a:
        _add_gap(tree, size, R, s, a)
    if b < e:
        _add_gap(tree, size, R, b, e)
    return True


@plain
def _release(tree, size, R, merge_all, a, b):  # pragma: no cover - compiled
    """Return [a, b) as free, merged with the gap ending at a and the one starting at b unless a
    segment starts there (``merge_all``: always merged)."""
    s = a
    e = b
    if merge_all or R[a, Rec.SEGS] == 0:
        left = R[a, Rec.GSOE]
        if left >= 0:
            _drop_gap(tree, size, R, left)
            s = left
    if (merge_all or R[b, Rec.SEGS] == 0) and tree[b + size] > 0:
        e = R[b, Rec.GEND]
        _drop_gap(tree, size, R, b)
    _add_gap(tree, size, R, s, e)


@plain
def _clear(tree, size, R, a, b):  # pragma: no cover - compiled
    """Drop every gap starting in [a, b) (a segment freed while blocks were still live)."""
    s = _succ(tree, size, a)
    while 0 <= s < b:
        _drop_gap(tree, size, R, s)
        s = _succ(tree, size, s)


@plain(inline="always")
def _segment_alloc(tree, size, R, merge_all, a, b):  # pragma: no cover - compiled
    """A segment [a, b) is mapped: a segment boundary at a, and the range is one new gap."""
    if a < b:
        R[a, Rec.SEGS] += 1
        _release(tree, size, R, merge_all, a, b)


@plain(inline="always")
def _segment_free(tree, size, R, a, b):  # pragma: no cover - compiled
    """A segment [a, b) is unmapped: its boundary goes, its gap is carved (or, under live blocks,
    every gap in it dropped)."""
    if a < b:
        R[a, Rec.SEGS] -= 1
        if not _carve(tree, size, R, a, b):
            _clear(tree, size, R, a, b)


@njit(cache=True)
def _new_stats():  # pragma: no cover - compiled
    """Zeroed ``stats`` with every index slot and MIN_LFB_FREE at NONE, and zeroed ``fstats``."""
    st = np.zeros(N_STATS, np.int64)
    st[Stat.PEAK_LIVE_IDX] = NONE
    st[Stat.PEAK_REQ_IDX] = NONE
    st[Stat.PEAK_RES_IDX] = NONE
    st[Stat.MIN_LFB_FREE] = NONE
    return st, np.zeros(N_FSTATS, np.float64)


@plain(inline="always")
def _peaks(st, i, live, req, res):  # pragma: no cover - compiled
    """Fold event i's live/requested/reserved into the PEAK_* slots (the first event at a maximum)."""
    if live > st[Stat.PEAK_LIVE] or st[Stat.PEAK_LIVE_IDX] < 0:
        st[Stat.PEAK_LIVE] = live
        st[Stat.PEAK_LIVE_IDX] = i
    if req > st[Stat.PEAK_REQ] or st[Stat.PEAK_REQ_IDX] < 0:
        st[Stat.PEAK_REQ] = req
        st[Stat.PEAK_REQ_IDX] = i
        st[Stat.RES_AT_PEAK_REQ] = res
    if res > st[Stat.PEAK_RES] or st[Stat.PEAK_RES_IDX] < 0:
        st[Stat.PEAK_RES] = res
        st[Stat.PEAK_RES_IDX] = i
        st[Stat.REQ_AT_PEAK_RES] = req
    elif res == st[Stat.PEAK_RES] and req > st[Stat.REQ_AT_PEAK_RES]:
        # A segment is reserved an event before the block it serves: among the
        # events at peak reserved, use the one with the most requested bytes.
        st[Stat.REQ_AT_PEAK_RES] = req


@plain(inline="always")
def _probe(probed, probes, p, i, live, req, res, lfb):  # pragma: no cover - compiled
    """Copy the state after event i into every ``probed`` row whose probe is i, from row p on;
    returns the next row to fill."""
    while p < probes.shape[0] and probes[p] == i:
        probed[p, Probe.LIVE] = live
        probed[p, Probe.REQ] = req
        probed[p, Probe.RES] = res
        probed[p, Probe.LFB] = lfb
        p += 1
    return p


@njit(cache=True)
def scan(op, size, rounded, t_ns, mate, lo, hi, pos, pooled, merge_all, probes, want,
         out_live, out_req, out_res, out_lfb, out_free, out_frag):  # pragma: no cover - compiled
    """One pass over the events: running sums, the largest free block, peaks.

    ``lo``/``hi`` (int64): the position range of each malloc/segment_alloc
    (and of unpaired frees); a free uses its malloc's range via ``mate``.
    ``pos`` (int64): the address of each position. ``pooled``: the trace has
    segment rows (else reserved = live and nothing is free). When ``want``
    the six ``out_*`` arrays receive the per-event values. ``probes``:
    increasing event indices (int64) whose state after the event goes to the
    row of the returned ``probed`` array (columns ``Probe``). After event i
    (bytes):

        live_i = Σ rounded, req_i = Σ size over live blocks; res_i = Σ live segment sizes
        (live_i when not ``pooled``); lfb_i = largest free gap (0 when not ``pooled``);
        free_i = res_i − live_i; frag_i = 1 − lfb_i / free_i (0 when free_i ≤ 0).

    ``t_ns``: event times; the state after event i is weighted by
    t_ns[i+1] − t_ns[i] (0 for the last event or when time goes backwards) in
    the TSUM_* sums. Returns (int64 stats, float64 fstats, int64 probed),
    indexed by ``Stat``, ``FStat`` and ``Probe``.
    """
    n = op.shape[0]
    tree, tsize = _new_tree(pos.shape[0])
    R = _new_records(pos)
    placed = np.zeros(n if pooled else 0, np.bool_)  # the malloc's block was carved from a gap
    st, fs = _new_stats()
    probed = np.zeros((probes.shape[0], N_PROBE), np.int64)
    p = 0
    live = np.int64(0)
    req = np.int64(0)
    res = np.int64(0)
    for i in range(n):
        o = op[i]
        if o == Op.MALLOC:
            live += np.int64(rounded[i])
            req += np.int64(size[i])
            if pooled and lo[i] < hi[i]:
                placed[i] = _carve(tree, tsize, R, lo[i], hi[i])
        elif o == Op.FREE:
            j = mate[i]
            if j < 0:  # its malloc is not in the trace: the free's own size is all there is
                live -= np.int64(size[i])
                req -= np.int64(size[i])
            else:
                live -= np.int64(rounded[j])
                req -= np.int64(size[j])
                if pooled and placed[j]:
                    _release(tree, tsize, R, merge_all, lo[j], hi[j])
        elif o == Op.SEGMENT_ALLOC:
            res += np.int64(size[i])
            _segment_alloc(tree, tsize, R, merge_all, lo[i], hi[i])
        elif o == Op.SEGMENT_FREE:
            j = mate[i] if mate[i] >= 0 else i  # the range of its segment_alloc when paired
            res -= np.int64(size[j])
            _segment_free(tree, tsize, R, lo[j], hi[j])
        r = res if pooled else live
        lfb = tree[0] if pooled else np.int64(0)
        free = r - live
        frag = 1.0 - lfb / free if free > 0 else 0.0
        if want:
            out_live[i] = live
            out_req[i] = req
            out_res[i] = r
            out_lfb[i] = lfb
            out_free[i] = free
            out_frag[i] = frag if frag > 0.0 else 0.0
        _peaks(st, i, live, req, r)
        p = _probe(probed, probes, p, i, live, req, r, lfb)
        # The sums stay in the loop: moved into a helper (inlined or not), the pass over a trace
        # without segments took twice as long. Δt_i = t_{i+1} − t_i where positive.
        fs[FStat.SUM_RES] += r
        fs[FStat.SUM_REQ] += req
        if i + 1 < n and t_ns[i + 1] > t_ns[i]:
            dt = np.float64(t_ns[i + 1] - t_ns[i])
            fs[FStat.TSUM_RES] += r * dt
            fs[FStat.TSUM_REQ] += req * dt
            fs[FStat.SUM_DT] += dt
        if free > 0:
            if frag > fs[FStat.MAX_FRAG]:
                fs[FStat.MAX_FRAG] = frag
            if st[Stat.MIN_LFB_FREE] < 0 or lfb < st[Stat.MIN_LFB_FREE]:
                st[Stat.MIN_LFB_FREE] = lfb
    return st, fs, probed
