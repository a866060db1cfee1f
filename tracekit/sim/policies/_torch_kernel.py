"""Compiled replay loop of PyTorch's CUDA caching allocator (``CUDACachingAllocator.cpp``).

A group is (pool, stream) with the large pool first (group = pool * streams +
stream index), so the free tree's order is PyTorch's (stream, size, address)
order within each pool. Per malloc of rounded size s: best fit in the group,
refusing a block >= max_split_size M for s < M and a block >= s + 20 MiB
(``max_non_split_rounding``) for s >= M; on a miss ``alloc_block`` for the
segment size (2 MiB / 20 MiB / 2 MiB multiple), failing when reserved +
segment > capacity or the device total is exceeded; then (only with M set)
``release_available_cached_blocks`` and retry: with key = max(s, M), free the
smallest cached block >= key of the request's stream and pool, else walk that
stream's and pool's cached blocks from the largest down while they are >= M,
freeing each (expandable ones skipped) until the freed bytes reach key, and
fail if they never do; then ``release_cached_blocks`` (every free whole
segment, large pool first) and retry, then OOM. Split:
small pool (or expandable segments) when the remainder is >= 512 B, large pool
only when s < M and the remainder > 1 MiB. Free merges with free neighbours.
Expandable segments live in ``_torch_expand``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import chunks as ck
from tracekit.sim import limit_test
from tracekit.sim import segments as sg
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Kind, Op, Slot, Stat, Status, TorchPool, Tree
from tracekit.sim.codes import Piece as P
from tracekit.sim.codes import TorchSetting as T
from tracekit.sim.policies import _torch_expand as xp
from tracekit.sim.prepare import stand_in

MIB = 1 << 20
NO_LIMIT = 1 << 62  # max_split_size unset


@plain(error_model="numpy")
def segment_size(s):  # pragma: no cover - compiled
    """Bytes cudaMalloc'd on a miss: 2 MiB (<= 1 MiB), 20 MiB (< 10 MiB), else 2 MiB multiples."""
    if s <= MIB:
        return 2 * MIB
    if s < 10 * MIB:
        return 20 * MIB
    return (s + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)


@plain(error_model="numpy")
def _floor_log2(x):  # pragma: no cover - compiled
    """floor(log2 x) of a uint64 x >= 1, by halving the shift (32, 16, ..., 1)."""
    lg = 0
    for shift in (32, 16, 8, 4, 2, 1):
        if x >> np.uint64(shift) != np.uint64(0):
            x >>= np.uint64(shift)
            lg += shift
    return lg


@njit(cache=True, error_model="numpy")
def round_sizes(size, div):  # pragma: no cover - compiled
    """``torch_rules.round_sizes`` in one pass (int64 out; uint64 arithmetic that wraps as
    ``size_t`` does): 512-byte multiples, and the division rule where ``div`` (16 uint64)
    asks for it. ``tests/unit/test_torch_rounding.py`` holds it to ``torch_rules.round_size``."""
    one = np.uint64(1)
    low = np.uint64(511)
    mask = ~low
    out = np.empty(size.shape[0], dtype=np.int64)
    divided = False
    for k in range(div.shape[0]):
        if div[k] > one:
            divided = True
    for i in range(size.shape[0]):
        s = np.uint64(size[i])
        if s < np.uint64(512):
            out[i] = 512
            continue
        r = (s + low) & mask
        if divided and s > np.uint64(1024):
            lg = _floor_log2(s)
            d = div[min(max(lg - 20, 0), 15)]
            if d > one and s > np.uint64(512) * d:
                p2 = one << np.uint64(lg)
                if s == p2:
                    r = s
                else:
                    step = p2 >> np.uint64(_floor_log2(d))
                    if step == np.uint64(0):
                        r = p2 << one
                    else:
                        fl = s & ~(step - one)
                        r = s if fl == s else fl + step
        out[i] = np.int64(r)
    return out


@plain(error_model="numpy")
def _pages(S, cfg, s):  # pragma: no cover - compiled
    """Most page rows one event can emit with expandable segments (unmap all, map s)."""
    if cfg[T.EXPANDABLE] == 0:
        return 0
    return (S[Slot.RESERVED] + segment_size(s)) // (2 * MIB) + 2


@plain(error_model="numpy")
def _alloc_block(C, S, R, i, g, s, seg, cfg, stream, X, hints):  # pragma: no cover - compiled
    """cudaMalloc of one segment for group g (or a mapping for expandable segments)."""
    # The capacity's limit test (``limit_test``): with no GC threshold the only place it enters.
    if not limit_test.passes(S, S[Slot.RESERVED] + seg, cfg[T.CAPACITY], Slot.ASKED, Slot.PASSED,
                             Slot.REFUSED):
        return -1
    if cfg[T.EXPANDABLE] != 0:
        return xp.try_allocate(C, S, R, i, g, s, cfg[T.DEVICE_TOTAL], stream, X, hints)
    if cfg[T.DEVICE_TOTAL] > 0 and S[Slot.DEV_USED] + sg.device_cost(seg) > cfg[T.DEVICE_TOTAL]:
        return -1
    a = sg.recorded_addr(C, S, X, i, seg, hints, True)
    return sg.add_segment(C, S, R, i, a, seg, g, stream[g])


@plain(error_model="numpy")
def _release_available(C, S, R, i, g, s, M, stream):  # pragma: no cover - compiled
    """Release cached blocks >= M: one that covers max(s, M), else the largest first."""
    key = max(s, M)
    it = ck.lower_bound(C, S, g, key)
    if it != -1 and C[it, F.GROUP] == g and C[it, F.EXP] == -1:
        if C[it, F.PREV] == -1 and C[it, F.NEXT] == -1:
            sg.release_whole(C, S, R, i, it, stream)
        return True
    cur = ck.pred(C, it, Tree.FREE) if it != -1 else ck.tree_last(C, S, Tree.FREE)
    total = 0
    while cur != -1 and total < key and C[cur, F.SIZE] >= M and C[cur, F.GROUP] == g:
        prv = ck.pred(C, cur, Tree.FREE)
        if C[cur, F.EXP] == -1 and C[cur, F.PREV] == -1 and C[cur, F.NEXT] == -1:
            total += C[cur, F.SIZE]
            sg.release_whole(C, S, R, i, cur, stream)
        cur = prv
    return total >= key


@njit(cache=True, error_model="numpy")
def release_cached(C, S, R, i, stream, X):  # pragma: no cover - compiled
    """``release_cached_blocks``: free whole segments, unmap free expandable pages."""
    sg.release_all_whole(C, S, R, i, stream)
    xp.unmap_all_free(C, S, R, i, stream, X)


@njit(cache=True, error_model="numpy")
def _garbage_collect(C, S, R, i, thr, n_streams, stream):  # pragma: no cover - compiled
    """``garbage_collect_cached_blocks``: with reserved over the threshold, release the
    unsplit large cached blocks whose age (large-pool lookups since they were cached) is
    at least the average, pass after pass, until reserved - threshold bytes are back."""
    if S[Slot.RESERVED] <= thr:
        return
    target = S[Slot.RESERVED] - thr
    k = 0
    x = S[Slot.WHEAD]
    while x != -1:
        k += 1
        x = C[x, F.WNEXT]
    ids = np.empty(k, dtype=np.int64)
    k = 0
    total_age = 0
    x = S[Slot.WHEAD]
    while x != -1:
        if C[x, F.GROUP] // n_streams == TorchPool.LARGE:
            ids[k] = x
            total_age += S[Slot.GCL] - C[x, F.GCBASE]
            k += 1
        x = C[x, F.WNEXT]
    ids = ids[:k]
    ids = ids[np.argsort(C[ids, F.ADDR], kind="mergesort")]
    ids = ids[np.argsort(C[ids, F.SIZE], kind="mergesort")]
    ids = ids[np.argsort(C[ids, F.GROUP], kind="mergesort")]
    alive = np.ones(k, dtype=np.bool_)
    count = k
    reclaimed = 0
    freed = True
    while reclaimed < target and freed and count > 0:
        threshold = total_age / count
        freed = False
        for j in range(k):
            x = ids[j]
            age = S[Slot.GCL] - C[x, F.GCBASE]
            if alive[j] and age >= threshold:
                alive[j] = False
                freed = True
                reclaimed += C[x, F.SIZE]
                total_age -= age
                count -= 1
                sg.release_whole(C, S, R, i, x, stream)


@plain(error_model="numpy")
def _find(C, S, g, s, M, nsr, expandable):  # pragma: no cover - compiled
    """``get_free_block``: the cached block to use for s in group g, or -1."""
    it = ck.lower_bound(C, S, g, s)
    if it == -1 or C[it, F.GROUP] != g:
        return -1
    if C[it, F.EXP] != -1 and expandable:
        nx = ck.succ(C, it, Tree.FREE)
        while C[it, F.EXP] != -1 and nx != -1 and C[nx, F.GROUP] == g and \
                xp.expandable_size(C, nx) < xp.expandable_size(C, it):
            it = nx
            nx = ck.succ(C, it, Tree.FREE)
    size = C[it, F.SIZE]
    if s < M and size >= M:
        return -1
    if s >= M and size >= s + nsr:
        return -1
    return it


@plain(error_model="numpy")
def _count_lookup(S, g, cfg):  # pragma: no cover - compiled
    """A lookup in group g, counted where garbage collection reads it: the large pool's
    ``get_free_blocks_call_count``, with a threshold set."""
    if cfg[T.GC_THRESHOLD] > 0 and g // cfg[T.STREAMS] == TorchPool.LARGE:
        S[Slot.GCL] += 1


@plain(error_model="numpy")
def _cached(C, S, g, s, cfg):  # pragma: no cover - compiled
    """``malloc``'s first step: the cached block for s in group g taken out of the cache, or -1."""
    _count_lookup(S, g, cfg)
    x = _find(C, S, g, s, cfg[T.MAX_SPLIT], cfg[T.MAX_NON_SPLIT], cfg[T.EXPANDABLE] != 0)
    if x != -1:
        ck.remove_free(C, S, x)
    return x


@njit(cache=True, error_model="numpy")
def _new_block(C, S, R, i, g, s, seg, cfg, stream, X, hints, refused):  # pragma: no cover - compiled
    """``malloc`` where no cached block fits (``_cached`` gave -1): a new segment, releasing cached
    memory before OOM (-1). The garbage collection and the unmapping make arrays, so this step
    counts references (``tracekit.compiled``); a hit in the cache (``_cached``, ``_take``) does not.

    ``refused`` > 0: the recording shows the device refusing this request's
    first ``alloc_block`` and the allocator then releasing ``refused`` bytes,
    so the first attempt fails here too; ``release_available_cached_blocks``
    then suffices when it frees at least that much, else ``release_cached_blocks``
    follows, as in PyTorch.
    """
    M = cfg[T.MAX_SPLIT]
    if cfg[T.GC_THRESHOLD] > 0:
        _garbage_collect(C, S, R, i, cfg[T.GC_THRESHOLD], cfg[T.STREAMS], stream)
    x = -1
    if refused == 0:
        x = _alloc_block(C, S, R, i, g, s, seg, cfg, stream, X, hints)
    if x == -1 and M < NO_LIMIT:
        held = S[Slot.RESERVED]
        if _release_available(C, S, R, i, g, s, M, stream) and held - S[Slot.RESERVED] >= refused:
            x = _alloc_block(C, S, R, i, g, s, seg, cfg, stream, X, hints)
    if x == -1:
        release_cached(C, S, R, i, stream, X)
        x = _alloc_block(C, S, R, i, g, s, seg, cfg, stream, X, hints)
    return x


@plain(error_model="numpy")
def _take(C, S, x, g, s, cfg):  # pragma: no cover - compiled
    """``malloc``'s last step: block x in use for s bytes, split where PyTorch splits it."""
    M = cfg[T.MAX_SPLIT]
    C[x, F.STATE] = P.USED
    rem = C[x, F.SIZE] - s
    small = g // cfg[T.STREAMS] == TorchPool.SMALL
    if small or cfg[T.EXPANDABLE] != 0:
        if rem >= 512:
            ck.split_front(C, S, x, s)
    elif s < M and rem > MIB:
        ck.split_front(C, S, x, s)


@plain(error_model="numpy")
def _easy_row(i, op, kind, rep, holder, size, rounded, group, mate, init, rel, retry, cfg, C, R, S,
              addr, status, blk):  # pragma: no cover - compiled
    """Replay row i where that makes no array: a free, a malloc that a cached block serves, a stand-in,
    a request of 0 bytes. False, having changed nothing: the row needs more (``_hard_row``)."""
    if init[i]:
        return True
    if rel[i]:
        return False
    kd = kind[i]
    if _stood_in(i, kind, rep, holder, addr, status, blk):
        return True
    if kd == Kind.ALLOC or kd == Kind.TRY:
        s = rounded[i]
        if size[i] == 0:  # PyTorch returns nullptr without touching the pool
            status[i] = Status.DONE
            blk[i] = -1
            return True
        if retry[i] > 0 or ck.short_of_room(C, S, 2 * S[Slot.NALIVE] + 8) or \
                ck.short_of_rows(R, S, S[Slot.NALIVE] + 8 + _pages(S, cfg, s)):
            return False
        g = group[i]
        x = _find(C, S, g, s, cfg[T.MAX_SPLIT], cfg[T.MAX_NON_SPLIT], cfg[T.EXPANDABLE] != 0)
        if x == -1:  # a new segment: ``_hard_row``, from ``_cached`` on (nothing done here yet)
            return False
        _count_lookup(S, g, cfg)  # ``_cached``, as it goes when a cached block fits
        ck.remove_free(C, S, x)
        _take(C, S, x, g, s, cfg)
        ck.placed(C, S, i, x, kd, rep, holder, addr, status, blk)
    elif op[i] == Op.FREE:
        ck.free_request(C, S, blk, status, mate, i)
    return True


@plain(error_model="numpy")
def _easy_rows(i, op, kind, rep, holder, size, rounded, group, mate, init, rel, retry, cfg, C, R, S,
               addr, status, blk):  # pragma: no cover - compiled
    """Replay rows from i while ``_easy_row`` can: the first row it could not (n: none).

    Most rows are easy, and this loop counts no references: in a compiled loop that may give C or R
    a new matrix, numba counts references to them at every row (two atomic instructions each way,
    ``tracekit.compiled``), about 40 % of a PyTorch replay's time before (``perf``)."""
    n = op.shape[0]
    while i < n:
        if not _easy_row(i, op, kind, rep, holder, size, rounded, group, mate, init, rel, retry, cfg, C, R, S,
                         addr, status, blk):
            return i
        i += 1
    return n


@plain(error_model="numpy")
def _stood_in(i, kind, rep, holder, addr, status, blk):  # pragma: no cover - compiled
    """Row i done by the handled attempt standing in for it, or skipped (``prepare.stand_in``): True;
    False: row i is placed as usual."""
    h = stand_in(kind, rep, holder, i)
    if h >= 0:  # a served handled attempt stands in for this malloc: its block
        blk[i] = blk[h]
        if addr.shape[0] > 0:
            addr[i] = addr[h]
    if h != -1:
        status[i] = Status.DONE if h >= 0 else Status.TRIED
        return True
    return False


@njit(cache=True, error_model="numpy", nogil=True)
def _hard_row(i, op, kind, rep, holder, size, rounded, group, mate, init, rel, retry, hints, stream, cfg,
              C, R, S, X, stats, addr, status, blk):  # pragma: no cover - compiled
    """Replay row i, whatever it needs (a new segment, a release, C or R grown): (C, R, stop), the
    matrices as they are now and whether the replay stops here (a fatal OOM)."""
    o = op[i]
    if init[i]:
        return C, R, False
    if rel[i]:
        if ck.short_of_room(C, S, 2 * S[Slot.NALIVE] + 8):
            C = ck.room(C, S, 2 * S[Slot.NALIVE] + 8)
        if ck.short_of_rows(R, S, S[Slot.NALIVE] + 4 + _pages(S, cfg, 0)):
            R = ck.rows_room(R, S, S[Slot.NALIVE] + 4 + _pages(S, cfg, 0))
        release_cached(C, S, R, i, stream, X)
    kd = kind[i]
    if _stood_in(i, kind, rep, holder, addr, status, blk):
        return C, R, False
    if kd == Kind.ALLOC or kd == Kind.TRY:
        s = rounded[i]
        if size[i] == 0:  # PyTorch returns nullptr without touching the pool
            status[i] = Status.DONE
            blk[i] = -1
            return C, R, False
        if ck.short_of_room(C, S, 2 * S[Slot.NALIVE] + 8):
            C = ck.room(C, S, 2 * S[Slot.NALIVE] + 8)
        if ck.short_of_rows(R, S, S[Slot.NALIVE] + 8 + _pages(S, cfg, s)):
            R = ck.rows_room(R, S, S[Slot.NALIVE] + 8 + _pages(S, cfg, s))
        refused = retry[i]
        if refused > 0 and _find(C, S, group[i], s, cfg[T.MAX_SPLIT], cfg[T.MAX_NON_SPLIT],
                                 cfg[T.EXPANDABLE] != 0) != -1:
            # A cached block fits, so the recorded release was the program's own.
            release_cached(C, S, R, i, stream, X)
            refused = 0
        # malloc: a cached block, else a new segment (releasing cached memory before OOM)
        x = _cached(C, S, group[i], s, cfg)
        if x == -1:
            x = _new_block(C, S, R, i, group[i], s, segment_size(s), cfg, stream, X, hints, refused)
        if x != -1:
            _take(C, S, x, group[i], s, cfg)
        if x == -1 and kd == Kind.TRY:  # the program survived this failure: it goes on
            status[i] = Status.OOM
            stats[Stat.HANDLED] += 1
            return C, R, False
        if x == -1:
            status[i] = Status.OOM
            ck.note_oom(C, S, i, group[i], s, stats)
            if cfg[T.CONTINUE] == 0:
                return C, R, True
            return C, R, False
        ck.placed(C, S, i, x, kd, rep, holder, addr, status, blk)
    elif o == Op.FREE:
        ck.free_request(C, S, blk, status, mate, i)
    return C, R, False


@njit(cache=True, error_model="numpy", nogil=True)  # nogil: advise replays settings in threads
def torch_replay(op, kind, rep, holder, size, rounded, group, mate, init, init_exp, init_addr, rel, retry,
                 hints, stream, cfg, C, R, S, X, stats, addr, status, blk):  # pragma: no cover - compiled
    """Replay every event; ``cfg`` is the ``TorchSetting`` vector.

    ``rel``: the program released cached memory before this row
    (``release_cached_blocks``); ``retry``: bytes the recorded allocator
    released while retrying this request (0: none), see ``_new_block``.

    The per-event arrays, the caller's (``tracekit.sim.scratch``): ``addr`` (each placed malloc's
    address; empty: not wanted, ``SimConfig.per_event`` off) and ``status`` (all zero on entry)
    are the outputs; ``blk``, each row's block where its malloc is DONE (-1: none), is read only
    there (a free reads its mate's, and a free's mate is always a malloc row: the reader pairs by
    address), so it needs no first value and a replay that stops early never touches the rest.
    """
    n = op.shape[0]
    outputs = addr.shape[0] > 0
    # The starting state's rows, found in one tight pass: the loops below then visit only them
    # (a loop over every row that may grow C and R costs tens of ns a row, even where none is initial).
    start = np.flatnonzero(init)
    for j in start:  # starting state: segments first, then the live blocks in them
        if op[j] == Op.SEGMENT_ALLOC:
            if ck.short_of_room(C, S, 4):
                C = ck.room(C, S, 4)
            if ck.short_of_rows(R, S, 4 + size[j] // (2 * MIB)):
                R = ck.rows_room(R, S, 4 + size[j] // (2 * MIB))
            if cfg[T.EXPANDABLE] != 0 and init_exp[j]:
                xp.map_initial(C, S, R, j, group[j], init_addr[j], size[j], stream, X)
            else:
                x = sg.add_segment(C, S, R, j, init_addr[j], size[j], group[j], stream[group[j]])
                ck.insert_free(C, S, x)
    for j in start:
        if op[j] == Op.MALLOC:
            if ck.short_of_room(C, S, 4):
                C = ck.room(C, S, 4)
            if ck.short_of_rows(R, S, 4):
                R = ck.rows_room(R, S, 4)
            blk[j] = sg.place_at(C, S, R, j, init_addr[j], rounded[j], group[j], stream)
            if outputs:
                addr[j] = init_addr[j]
            status[j] = Status.DONE
            ck.add_live(S, rounded[j])
    i = 0
    while i < n:
        # The rows that make no array, in a loop that counts no references (``_easy_rows``); the
        # others one at a time (``_hard_row``: a new segment, a release, C or R grown).
        i = _easy_rows(i, op, kind, rep, holder, size, rounded, group, mate, init, rel, retry, cfg, C, R, S,
                       addr, status, blk)
        if i >= n:
            break
        C, R, stop = _hard_row(i, op, kind, rep, holder, size, rounded, group, mate, init, rel, retry, hints,
                               stream, cfg, C, R, S, X, stats, addr, status, blk)
        if stop:
            break
        i += 1
    return C, R
