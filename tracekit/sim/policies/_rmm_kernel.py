"""Compiled replay loop of RMM's ``pool_memory_resource`` (rapidsai/rmm, ``cpp/src/mr/detail/
pool_memory_resource_impl.cpp`` over ``stream_ordered_memory_resource.hpp`` and
``coalescing_free_list.hpp``).

State: the chunk store of ``tracekit.sim.chunks``. A piece's ``GROUP`` is the free list it is on:
one per stream (``stream_ordered_memory_resource::stream_free_blocks_``), numbered by the policy in
the order the lists come into use, list 0 the legacy default stream's (the initial pool block goes
there). A piece's address neighbours (``PREV``/``NEXT``) never cross a device allocation, as RMM
never coalesces a block with an upstream block's head.

Per request of b bytes (``allocate``): b = 0 is a null pointer, nothing else; else s = b aligned up
to 256 (``rmm::CUDA_ALLOCATION_ALIGNMENT``) and ``get_block(s, stream)``:

1. best fit on the request's own list (``coalescing_free_list::get_block``: the smallest block of
   at least s, ties to the lowest address);
2. else each other list in turn, best fit on it alone (the rest of the block stays on that list);
3. else each other list in turn merged whole into the request's list (blocks coalescing as they
   come), best fit after each merge;
4. else ``expand_pool``: ``size_to_grow(s)`` is, with a maximum pool size M,
   ``max(s, remaining / 2)`` where remaining = align_up(M - pool size, 256), or 0 when s >
   remaining; without one ``max(s, pool size)``. ``try_to_expand`` asks the upstream for that
   many bytes, halving (never below s) while the device refuses, and fails (``rmm::out_of_memory``)
   when s itself is refused or nothing may grow. The new block's rest goes on the request's list.

The block taken keeps its low s bytes. A free of a block (``deallocate``, on the stream of the
free) puts it on that stream's list, coalescing with address neighbours already on that list. The
upstream is ``cuda_memory_resource``: with a device total, a device allocation of t bytes fits when
the device bytes in use plus ``segments.device_cost(t)`` do not pass it. Under a maximum, a pool
that cannot grow by a request first gives its wholly free upstream blocks of the request's list
back, lowest address first, until the request has room (``reclaim``; RMM's own code, in the
version read, takes them from the owner list of the request's stream); otherwise the pool never
gives memory back. Settings come by name (``RmmSetting``); sizes in bytes.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import chunks as ck
from tracekit.sim import segments as sg
from tracekit.sim.chunks import PAGE
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Kind, Slot, Stat, Status, Tree
from tracekit.sim.codes import Piece as P
from tracekit.sim.prepare import stand_in

ALIGNMENT = 256  # rmm::CUDA_ALLOCATION_ALIGNMENT (cpp/include/rmm/aligned.hpp)
NO_MAXIMUM = -1  # ``RmmSetting.MAXIMUM``: no maximum pool size (std::nullopt)
TOP_ADDR = 1 << 62  # invented upstream addresses fall from here (``from_upstream``): never below 0


class RmmSetting(IntEnum):
    """The ``rmm-pool`` kernel's settings vector (bytes unless noted)."""

    INITIAL = 0  # initial_pool_size: the first upstream block, on the legacy stream's list (0: none)
    MAXIMUM = 1  # maximum_pool_size, ``NO_MAXIMUM`` for none
    DEVICE_TOTAL = 2  # device bytes the upstream may take, 0 = unbounded
    CONTINUE = 3  # 1: go on after a failed request


class Found(IntEnum):
    """Which step of ``get_block`` served a request (counted in ``found``)."""

    OWN = 0  # best fit on the request's own stream list
    OTHER = 1  # taken from another stream's list as it was
    MERGED = 2  # after merging other streams' lists into the request's
    GREW = 3  # from a new upstream block
    FAILED = 4  # out of memory


@plain(error_model="numpy")
def align_up(b):  # pragma: no cover - compiled
    """b bytes rounded up to a multiple of ``ALIGNMENT``."""
    return (b + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@plain(error_model="numpy")
def size_to_grow(s, pool, maximum):  # pragma: no cover - compiled
    """``pool_memory_resource_impl::size_to_grow``: bytes to ask the upstream for, 0 = may not grow."""
    if maximum != NO_MAXIMUM:
        remaining = align_up(max(maximum - pool, 0))
        aligned = align_up(s)
        if aligned <= remaining:
            return max(aligned, remaining // 2)
        return 0
    return max(s, pool)


@plain(error_model="numpy")
def best_fit(C, S, g, s):  # pragma: no cover - compiled
    """The smallest free piece of at least s bytes on list g (ties: lowest address), or -1."""
    x = ck.lower_bound(C, S, g, s)
    if x != -1 and C[x, F.GROUP] == g:
        return x
    return -1


@plain(error_model="numpy")
def free_into(C, S, x, g):  # pragma: no cover - compiled
    """Put piece x (in no tree) on list g, coalescing with its address neighbours free on g."""
    C[x, F.GROUP] = g
    nx = C[x, F.NEXT]
    if nx != -1 and C[nx, F.STATE] == P.FREE and C[nx, F.GROUP] == g:
        ck.remove_free(C, S, nx)
        ck.absorb_next(C, S, x)
    p = C[x, F.PREV]
    if p != -1 and C[p, F.STATE] == P.FREE and C[p, F.GROUP] == g:
        ck.remove_free(C, S, p)
        ck.absorb_next(C, S, p)
        x = p
    ck.insert_free(C, S, x)
    return x


@plain(error_model="numpy")
def merge_list(C, S, h, g):  # pragma: no cover - compiled
    """Move every free piece of list h onto list g (``merge_lists``), coalescing as they come."""
    while True:
        y = ck.first_in_group(C, S, h, Tree.FREE)
        if y == -1:
            return
        ck.remove_free(C, S, y)
        free_into(C, S, y, g)


@plain(error_model="numpy")
def from_upstream(C, S, R, i, t, g, stream):  # pragma: no cover - compiled
    """``block_from_upstream``: a new device allocation of t bytes, one used piece on list g, at an
    invented address a page below every earlier one (``cudaMalloc`` hands out falling addresses)."""
    addr = S[Slot.NEXT_ADDR] - (t + PAGE - 1) // PAGE * PAGE - PAGE
    S[Slot.NEXT_ADDR] = addr
    return sg.add_segment(C, S, R, i, addr, t, g, stream)


@njit(cache=True, error_model="numpy")
def reclaim(C, S, R, i, s, g, maximum, group_stream):  # pragma: no cover - compiled
    """``reclaim_free_blocks``: give wholly free upstream blocks of list g back to the device, lowest
    address first, until the pool has room for s bytes under the maximum; the number given back."""
    if s > maximum:  # no reclaim could make room
        return 0
    ids = sg.whole_free_in(C, S, g)  # by address, as upstream_blocks_ is ordered
    n = 0
    for j in range(len(ids)):
        room = maximum - S[Slot.RESERVED]
        if room < 0 or room >= s:  # unsigned in RMM: a pool past M (by < 256 B) wraps to a huge room
            break
        sg.release_whole(C, S, R, i, ids[j], group_stream)
        n += 1
    return n


@njit(cache=True, error_model="numpy")
def grow(C, S, R, i, s, g, maximum, dev_total, group_stream):  # pragma: no cover - compiled
    """``expand_pool`` for a request of s (aligned) bytes on list g: the new used piece, or -1."""
    t = size_to_grow(s, S[Slot.RESERVED], maximum)
    if t < s and maximum != NO_MAXIMUM:  # no room under the maximum: reclaim free upstream blocks
        reclaim(C, S, R, i, s, g, maximum, group_stream)
        t = size_to_grow(s, S[Slot.RESERVED], maximum)
    while t >= s and t > 0:
        if dev_total == 0 or S[Slot.DEV_USED] + sg.device_cost(t) <= dev_total:
            x = from_upstream(C, S, R, i, t, g, group_stream[g])
            if t > s:
                ck.split_front(C, S, x, s)
            return x
        if t == s:
            return -1
        t = max(s, t // 2)
    return -1


@njit(cache=True, error_model="numpy")
def get_block(C, S, R, i, s, g, ngroups, maximum, dev_total, group_stream, found):  # pragma: no cover
    """``stream_ordered_memory_resource::get_block``: the used piece serving s bytes on list g, or -1."""
    x = best_fit(C, S, g, s)
    step = Found.OWN
    h = 0
    while x == -1 and h < ngroups:  # each other list as it is
        if h != g:
            x = best_fit(C, S, h, s)
            step = Found.OTHER
        h += 1
    h = 0
    while x == -1 and h < ngroups:  # each other list merged into the request's
        if h != g:
            merge_list(C, S, h, g)
            x = best_fit(C, S, g, s)
            step = Found.MERGED
        h += 1
    if x != -1:
        ck.take_front(C, S, x, s)
        found[step] += 1
        return x
    x = grow(C, S, R, i, s, g, maximum, dev_total, group_stream)
    found[Found.GREW if x != -1 else Found.FAILED] += 1
    return x


@njit(cache=True, error_model="numpy", nogil=True)  # nogil: advise replays settings in threads
def rmm_replay(op, kind, rep, holder, size, group, ngroups, group_stream, mate, cfg, C, R, S, stats,
               found):  # pragma: no cover - compiled
    """Replay every input row (``Kind``) through the pool; per row the address given, the
    ``Status`` and the aligned bytes. ``group[i]``: the list of row i's stream (``ngroups`` lists,
    ``group_stream[g]`` the stream value of list g); ``found`` counts by ``Found``."""
    n = op.shape[0]
    addr = np.zeros(n, dtype=np.int64)
    status = np.zeros(n, dtype=np.int8)
    rounded = np.zeros(n, dtype=np.int64)
    # Each row's block where its malloc is DONE (-1: none), read only there (a free's mate is always
    # a malloc row): untouched until written (``_torch_kernel.torch_replay`` says why).
    blk = np.empty(n, dtype=np.int64)
    maximum = cfg[RmmSetting.MAXIMUM]
    dev_total = cfg[RmmSetting.DEVICE_TOTAL]
    if cfg[RmmSetting.INITIAL] > 0:  # initialize_pool: one upstream block on the legacy stream's list
        if ck.short_of_room(C, S, 4):
            C = ck.room(C, S, 4)
        if ck.short_of_rows(R, S, 4):
            R = ck.rows_room(R, S, 4)
        x = from_upstream(C, S, R, 0, cfg[RmmSetting.INITIAL], 0, group_stream[0])
        ck.insert_free(C, S, x)
    for i in range(n):
        kd = kind[i]
        h = stand_in(kind, rep, holder, i)
        if h >= 0:  # a served handled attempt stands in for this malloc: its block
            blk[i] = blk[h]
            addr[i] = addr[h]
            rounded[i] = rounded[h]
        if h != -1:
            status[i] = Status.DONE if h >= 0 else Status.TRIED
            continue
        if kd == Kind.ALLOC or kd == Kind.TRY:
            if size[i] == 0:  # stream_ordered_memory_resource::allocate returns nullptr
                status[i] = Status.DONE
                blk[i] = -1
                continue
            s = align_up(size[i])
            rounded[i] = s
            g = group[i]
            if ck.short_of_room(C, S, 4):
                C = ck.room(C, S, 4)
            if ck.short_of_rows(R, S, 4 + S[Slot.SEGA] - S[Slot.SEGF]):  # a reclaim may free every block
                R = ck.rows_room(R, S, 4 + S[Slot.SEGA] - S[Slot.SEGF])
            x = get_block(C, S, R, i, s, g, ngroups, maximum, dev_total, group_stream, found)
            if x == -1 and kd == Kind.TRY:  # the program survived this failure: it goes on
                status[i] = Status.OOM
                stats[Stat.HANDLED] += 1
                continue
            if x == -1:
                status[i] = Status.OOM
                ck.note_oom(C, S, i, g, s, stats)
                if cfg[RmmSetting.CONTINUE] == 0:
                    break
                continue
            if kd == Kind.TRY and rep[i] < 0:  # served; nothing replaced it: released at once
                free_into(C, S, x, g)
                status[i] = Status.TRIED
                continue
            if kd == Kind.TRY:  # served: it lives in place of the retry that replaced it
                holder[rep[i]] = i
            blk[i] = x
            addr[i] = C[x, F.ADDR]
            status[i] = Status.TRIED if kd == Kind.TRY else Status.DONE
            ck.add_live(S, s)
        elif kd == Kind.FREE:
            m = mate[i]
            if m < 0 or status[m] != Status.DONE:
                status[i] = Status.SKIPPED
                continue
            status[i] = Status.DONE
            x = blk[m]
            if x < 0:  # a 0-byte request: nothing to give back
                continue
            ck.add_live(S, -C[x, F.SIZE])
            free_into(C, S, x, group[i])
    return addr, status, rounded, C, R
