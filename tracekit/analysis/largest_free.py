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
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.trace.schema import Op

# Slots of the int64 ``stats`` array filled by ``scan``.
PEAK_LIVE, PEAK_LIVE_IDX, PEAK_REQ, PEAK_REQ_IDX, RES_AT_PEAK_REQ = 0, 1, 2, 3, 4
PEAK_RES, PEAK_RES_IDX, REQ_AT_PEAK_RES, MIN_LFB_FREE, N_STATS = 5, 6, 7, 8, 9
# Columns of the int64 ``probed`` array: the state after each probed event.
PROBE_LIVE, PROBE_REQ, PROBE_RES, PROBE_LFB, N_PROBE = 0, 1, 2, 3, 4
# Slots of the float64 ``fstats`` array.
# SUM_*: Σ over events; TSUM_*: Σ weighted by the time to the next event (ns); SUM_DT: Σ of those weights.
SUM_RES, SUM_REQ, MAX_FRAG, TSUM_RES, TSUM_REQ, SUM_DT, N_FSTATS = 0, 1, 2, 3, 4, 5, 6


# The max-tree is 8-ary and implicit: node j's children are 8j+1 … 8j+8 (one
# 64-byte line once the array is aligned), so an update climbs about log8(m)
# levels, reading one cache line per level. Elsewhere ``size`` is the index of
# leaf 0 (leaf k is ``tree[size + k]``) and the root ``tree[0]`` is the maximum.
FAN = 8


@njit(cache=True)
def _new_tree(m):  # pragma: no cover - compiled
    # Leaves: FAN**depth >= m; returns (array, index of leaf 0), aligned so sibling groups share a line.
    leaves = 1
    first = 0
    while leaves < max(m, 1):
        first += leaves
        leaves *= FAN
    n = first + leaves
    raw = np.zeros(n + 16, np.int64)
    # Sibling groups start at indices 8p+1; shift so that index lands on a 64-byte boundary.
    base = raw.ctypes.data // 8
    off = (7 - base) % 8
    return raw[off:off + n], first


@njit(cache=True)
def _set(tree, first, k, v):  # pragma: no cover - compiled
    # Point update of leaf k, climbing only while the group maximum changes.
    j = first + k
    tree[j] = v
    while j > 0:
        p = (j - 1) >> 3
        c = 8 * p + 1
        m = tree[c]
        for q in range(c + 1, c + FAN):
            if tree[q] > m:
                m = tree[q]
        if tree[p] == m:
            return
        tree[p] = m
        j = p


@njit(cache=True)
def _down(tree, first, j, rightmost):  # pragma: no cover - compiled
    # From a node known to hold a gap, descend to its rightmost (or leftmost) gap leaf.
    while j < first:
        c = 8 * j + 1
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


@njit(cache=True)
def _pred(tree, first, k):  # pragma: no cover - compiled
    # Rightmost leaf <= k holding a gap, or -1.
    j = first + k
    if tree[j] > 0:
        return k
    while j > 0:
        c = 8 * ((j - 1) >> 3) + 1
        for q in range(j - 1, c - 1, -1):
            if tree[q] > 0:
                return _down(tree, first, q, True)
        j = (j - 1) >> 3
    return -1


@njit(cache=True)
def _succ(tree, first, k):  # pragma: no cover - compiled
    # Leftmost leaf >= k holding a gap, or -1.
    j = first + k
    if tree[j] > 0:
        return k
    while j > 0:
        c = 8 * ((j - 1) >> 3) + 1
        for q in range(j + 1, c + FAN):
            if tree[q] > 0:
                return _down(tree, first, q, False)
        j = (j - 1) >> 3
    return -1


# Columns of the per-position record table (one row per position, so the facts
# about one address share a cache line): its address, the end position of the
# gap starting there, the start position of the gap ending there (-1 = none),
# and how many live segments start there.
POS, GEND, GSOE, SEGS, RCOLS = 0, 1, 2, 3, 4


@njit(cache=True)
def _add_gap(tree, size, R, s, e):  # pragma: no cover - compiled
    length = R[e, POS] - R[s, POS]
    if length > 0:
        R[s, GEND] = e
        R[e, GSOE] = s
        _set(tree, size, s, length)


@njit(cache=True)
def _drop_gap(tree, size, R, s):  # pragma: no cover - compiled
    R[R[s, GEND], GSOE] = -1
    _set(tree, size, s, 0)


@njit(cache=True)
def _carve(tree, size, R, a, b):  # pragma: no cover - compiled
    # Take [a, b) out of the gap holding it; False if no gap holds all of it.
    s = a if tree[a + size] > 0 else _pred(tree, size, a)
    if s < 0 or R[s, GEND] < b:
        return False
    e = R[s, GEND]
    _drop_gap(tree, size, R, s)
    if s < a:
        _add_gap(tree, size, R, s, a)
    if b < e:
        _add_gap(tree, size, R, b, e)
    return True


@njit(cache=True)
def _release(tree, size, R, merge_all, a, b):  # pragma: no cover - compiled
    # Return [a, b) as free, merged with its free neighbours inside one segment.
    s = a
    e = b
    if merge_all or R[a, SEGS] == 0:
        left = R[a, GSOE]
        if left >= 0:
            _drop_gap(tree, size, R, left)
            s = left
    if (merge_all or R[b, SEGS] == 0) and tree[b + size] > 0:
        e = R[b, GEND]
        _drop_gap(tree, size, R, b)
    _add_gap(tree, size, R, s, e)


@njit(cache=True)
def _clear(tree, size, R, a, b):  # pragma: no cover - compiled
    # Drop every gap starting in [a, b) (a segment freed while blocks were still live).
    s = _succ(tree, size, a)
    while 0 <= s < b:
        _drop_gap(tree, size, R, s)
        s = _succ(tree, size, s)


@njit(cache=True)
def scan(op, size, rounded, t_ns, mate, lo, hi, pos, pooled, merge_all, probes, want,
         out_live, out_req, out_res, out_lfb, out_free, out_frag):  # pragma: no cover - compiled
    """One pass over the events: running sums, the largest free block, peaks.

    ``lo``/``hi`` (int64): the position range of each malloc/segment_alloc
    (and of unpaired frees); a free uses its malloc's range via ``mate``.
    ``pos`` (int64): the address of each position. ``pooled``: the trace has
    segment rows (else reserved = live and nothing is free). When ``want``
    the four ``out_*`` arrays receive the per-event values. ``probes``:
    increasing event indices (int64) whose state after the event goes to the
    row of the returned ``probed`` array (columns PROBE_*). ``out_free``
    gets reserved − live, ``out_frag`` the external fragmentation
    1 − largest free / free (0 when nothing is free).
    ``t_ns``: event times; the state after event i is weighted by
    t_ns[i+1] − t_ns[i] (0 for the last event or when time goes backwards) in
    the TSUM_* sums. Returns (int64 stats, float64 fstats, int64 probed)
    indexed by the module constants.
    """
    n = op.shape[0]
    m = pos.shape[0]
    tree, tsize = _new_tree(m)
    R = np.zeros((max(m, 1), RCOLS), np.int64)
    for k in range(m):
        R[k, POS] = pos[k]
        R[k, GSOE] = -1
    placed = np.zeros(n if pooled else 0, np.bool_)
    st = np.zeros(N_STATS, np.int64)
    fs = np.zeros(N_FSTATS, np.float64)
    probed = np.zeros((probes.shape[0], N_PROBE), np.int64)
    p = 0
    st[PEAK_LIVE_IDX] = -1
    st[PEAK_REQ_IDX] = -1
    st[PEAK_RES_IDX] = -1
    st[MIN_LFB_FREE] = -1
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
            if j < 0:
                live -= np.int64(size[i])
                req -= np.int64(size[i])
            else:
                live -= np.int64(rounded[j])
                req -= np.int64(size[j])
                if pooled and placed[j]:
                    _release(tree, tsize, R, merge_all, lo[j], hi[j])
        elif o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE:
            j = mate[i] if o == Op.SEGMENT_FREE else i
            if j < 0:
                j = i
            a = lo[j]
            b = hi[j]
            if o == Op.SEGMENT_ALLOC:
                res += np.int64(size[j])
                if a < b:
                    R[a, SEGS] += 1
                    _release(tree, tsize, R, merge_all, a, b)
            else:
                res -= np.int64(size[j])
                if a < b:
                    R[a, SEGS] -= 1
                    if not _carve(tree, tsize, R, a, b):
                        _clear(tree, tsize, R, a, b)
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
        if live > st[PEAK_LIVE] or st[PEAK_LIVE_IDX] < 0:
            st[PEAK_LIVE] = live
            st[PEAK_LIVE_IDX] = i
        if req > st[PEAK_REQ] or st[PEAK_REQ_IDX] < 0:
            st[PEAK_REQ] = req
            st[PEAK_REQ_IDX] = i
            st[RES_AT_PEAK_REQ] = r
        if r > st[PEAK_RES] or st[PEAK_RES_IDX] < 0:
            st[PEAK_RES] = r
            st[PEAK_RES_IDX] = i
            st[REQ_AT_PEAK_RES] = req
        elif r == st[PEAK_RES] and req > st[REQ_AT_PEAK_RES]:
            # A segment is reserved an event before the block it serves: among the
            # events at peak reserved, use the one with the most requested bytes.
            st[REQ_AT_PEAK_RES] = req
        while p < probes.shape[0] and probes[p] == i:
            probed[p, PROBE_LIVE] = live
            probed[p, PROBE_REQ] = req
            probed[p, PROBE_RES] = r
            probed[p, PROBE_LFB] = lfb
            p += 1
        fs[SUM_RES] += r
        fs[SUM_REQ] += req
        if i + 1 < n and t_ns[i + 1] > t_ns[i]:
            dt = np.float64(t_ns[i + 1] - t_ns[i])
            fs[TSUM_RES] += r * dt
            fs[TSUM_REQ] += req * dt
            fs[SUM_DT] += dt
        if free > 0:
            if frag > fs[MAX_FRAG]:
                fs[MAX_FRAG] = frag
            if st[MIN_LFB_FREE] < 0 or lfb < st[MIN_LFB_FREE]:
                st[MIN_LFB_FREE] = lfb
    return st, fs, probed
