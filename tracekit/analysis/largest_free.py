"""The largest free block over time: a compiled interval structure over address ranges.

Every address a trace will ever touch is known up front, so the boundaries
(block starts/ends, segment starts/ends) are coordinate-compressed into a
sorted list of positions and the address line becomes a row of *leaves*: one
elementary interval ``[p_k, p_k+1)`` per position, plus a zero-length
*barrier* leaf before every position that is ever a segment boundary (so a
free run never crosses from one segment into an adjacent one). Each leaf
carries a cover count ``u = 1 − (live segments over it) + (live blocks over
it) + (live segments starting at it)``; a leaf is free exactly when
``u == 0`` and ``u`` never goes below 0 in a consistent trace. A barrier leaf
is thus free only inside a segment, never where one segment meets the next.
Every event is a range add on ``u`` (segment_alloc −1 over the segment and +1
on its barrier leaf, segment_free the reverse, malloc +1, free −1), so a
segment tree with
per-node (min, prefix run, suffix run, best run) at the node's minimum answers
"longest run of free bytes" at the root in O(1) after an O(log m) update.
Nothing is recomputed per event; the whole pass is one ``@njit`` loop that
also keeps the running live/requested/reserved sums and their peaks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Slots of the int64 ``stats`` array filled by ``scan``.
PEAK_LIVE, PEAK_LIVE_IDX, PEAK_REQ, PEAK_REQ_IDX, RES_AT_PEAK_REQ = 0, 1, 2, 3, 4
PEAK_RES, PEAK_RES_IDX, REQ_AT_PEAK_RES, MIN_LFB_FREE = 5, 6, 7, 8
PROBE_LIVE, PROBE_REQ, PROBE_RES, PROBE_LFB, N_STATS = 9, 10, 11, 12, 13
# Slots of the float64 ``fstats`` array.
SUM_RES, SUM_REQ, MAX_FRAG, N_FSTATS = 0, 1, 2, 3


@njit(cache=True)
def _pull(i, mn, add, pre, suf, best, full, length):  # pragma: no cover - compiled
    # Combine children 2i and 2i+1; only the runs of a child at the joint min count.
    a = 2 * i
    b = a + 1
    ma = mn[a]
    mb = mn[b]
    m = ma if ma < mb else mb
    if ma == m:
        ap, asf, ab, af = pre[a], suf[a], best[a], full[a]
    else:
        ap, asf, ab, af = 0, 0, 0, 0
    if mb == m:
        bp, bs, bb, bf = pre[b], suf[b], best[b], full[b]
    else:
        bp, bs, bb, bf = 0, 0, 0, 0
    x = asf + bp
    if ab > x:
        x = ab
    if bb > x:
        x = bb
    best[i] = x
    pre[i] = length[a] + bp if af else ap
    suf[i] = length[b] + asf if bf else bs
    full[i] = af & bf
    mn[i] = m + add[i]


@njit(cache=True)
def _range_add(lo, hi, d, size, mn, add, pre, suf, best, full, length):  # pragma: no cover
    # Add d to u over leaves [lo, hi): bottom-up, no lazy push (a node's min
    # includes its own pending add), then re-pull the two boundary paths.
    if lo >= hi:
        return
    left = lo + size
    right = hi + size
    l0 = left
    r0 = right - 1
    while left < right:
        if left & 1:
            add[left] += d
            mn[left] += d
            left += 1
        if right & 1:
            right -= 1
            add[right] += d
            mn[right] += d
        left >>= 1
        right >>= 1
    a = l0 >> 1
    b = r0 >> 1
    while a != b:
        _pull(a, mn, add, pre, suf, best, full, length)
        _pull(b, mn, add, pre, suf, best, full, length)
        a >>= 1
        b >>= 1
    while a >= 1:
        _pull(a, mn, add, pre, suf, best, full, length)
        a >>= 1


@njit(cache=True)
def build_tree(leaf_len):  # pragma: no cover - compiled
    """Arrays of a tree over ``leaf_len`` (int64 bytes per leaf); every leaf starts at u = 1."""
    m = leaf_len.shape[0]
    size = 1
    while size < max(m, 1):
        size *= 2
    mn = np.ones(2 * size, np.int32)
    add = np.zeros(2 * size, np.int32)
    pre = np.zeros(2 * size, np.int64)
    suf = np.zeros(2 * size, np.int64)
    best = np.zeros(2 * size, np.int64)
    full = np.ones(2 * size, np.uint8)
    length = np.zeros(2 * size, np.int64)
    for k in range(m):
        length[size + k] = leaf_len[k]
    for k in range(size, 2 * size):
        add[k] = 1
        pre[k] = length[k]
        suf[k] = length[k]
        best[k] = length[k]
    for i in range(size - 1, 0, -1):
        length[i] = length[2 * i] + length[2 * i + 1]
        _pull(i, mn, add, pre, suf, best, full, length)
    return size, mn, add, pre, suf, best, full, length


@njit(cache=True)
def scan(op, size, rounded, mate, lo, hi, leaf_len, pooled, probe, want,
         out_live, out_req, out_res, out_lfb):  # pragma: no cover - compiled
    """One pass over the events: running sums, the largest free block, peaks.

    ``lo``/``hi`` (int32): the leaf range of each malloc/segment_alloc (and of
    unpaired frees); a free uses its malloc's range via ``mate``. ``pooled``:
    the trace has segment rows (else reserved = live and nothing is free).
    When ``want`` the four ``out_*`` arrays receive the per-event values.
    ``probe``: an event index whose values after the event go to the PROBE_*
    slots (-1 = none). Returns (int64 stats, float64 fstats) indexed by the
    module constants.
    """
    n = op.shape[0]
    tsize, mn, add, pre, suf, best, full, length = build_tree(leaf_len)
    st = np.zeros(N_STATS, np.int64)
    fs = np.zeros(N_FSTATS, np.float64)
    st[PEAK_LIVE_IDX] = -1
    st[PEAK_REQ_IDX] = -1
    st[PEAK_RES_IDX] = -1
    st[MIN_LFB_FREE] = -1
    live = np.int64(0)
    req = np.int64(0)
    res = np.int64(0)
    for i in range(n):
        o = op[i]
        if o == 0:  # malloc
            live += np.int64(rounded[i])
            req += np.int64(size[i])
            if pooled:
                _range_add(lo[i], hi[i], 1, tsize, mn, add, pre, suf, best, full, length)
        elif o == 1:  # free
            j = mate[i]
            if j < 0:
                j = i
                live -= np.int64(size[i])
                req -= np.int64(size[i])
            else:
                live -= np.int64(rounded[j])
                req -= np.int64(size[j])
            if pooled:
                _range_add(lo[j], hi[j], -1, tsize, mn, add, pre, suf, best, full, length)
        elif o == 2 or o == 3:  # segment_alloc / segment_free
            j = mate[i] if o == 3 else i
            if j < 0:
                j = i
            d = 1 if o == 2 else -1
            res += d * np.int64(size[j])
            a = lo[j]
            b = hi[j]
            if a < b:
                # Cover the segment's leaves, then block its own barrier leaf: that
                # leaf splits this segment's free space from a segment ending at a.
                _range_add(a, b, -d, tsize, mn, add, pre, suf, best, full, length)
                _range_add(a, a + 1, d, tsize, mn, add, pre, suf, best, full, length)
        r = res if pooled else live
        lfb = best[1] if (pooled and mn[1] == 0) else np.int64(0)
        free = r - live
        if want:
            out_live[i] = live
            out_req[i] = req
            out_res[i] = r
            out_lfb[i] = lfb
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
        if i == probe:
            st[PROBE_LIVE] = live
            st[PROBE_REQ] = req
            st[PROBE_RES] = r
            st[PROBE_LFB] = lfb
        fs[SUM_RES] += r
        fs[SUM_REQ] += req
        if free > 0:
            frag = 1.0 - lfb / free
            if frag > fs[MAX_FRAG]:
                fs[MAX_FRAG] = frag
            if st[MIN_LFB_FREE] < 0 or lfb < st[MIN_LFB_FREE]:
                st[MIN_LFB_FREE] = lfb
    return st, fs
