"""Compiled replay loop of CuPy's ``SingleDeviceMemoryPool`` (CuPy 14.x).

Per malloc of s bytes (rounded up to 512): best fit in the stream's arena
(smallest free chunk >= s; among equal sizes the chunk the recorded
trace shows CuPy taking, when the trace is a recording, else the lowest address); a larger chunk keeps
its low s bytes and the rest becomes a free chunk. On a miss, ``_try_malloc``:
with a limit L, s > L fails at once; if reserved + s > L, release every free
whole device allocation (``free_all_blocks``, all arenas) and fail if still
over. With a device total, a device allocation that does not fit (cost:
``device_cost``) releases the same way and retries once. Success takes exactly
s bytes from the device. A free merges with free neighbours of the same device
allocation. ``malloc`` and ``oom`` rows (replayed as a malloc) allocate, ``free``
rows free, other rows are ignored. Settings come by name (``CupySetting``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import chunks as ck
from tracekit.sim import limit_test
from tracekit.sim import segments as sg
from tracekit.sim.codes import CupySetting, Kind, Op, Reservation, Slot, Stat, Status
from tracekit.sim.codes import Field as F
from tracekit.sim.prepare import stand_in

NO_RELEASE = -2  # ``rel``: no release here; -1 releases every arena, k >= 0 arena k alone
NO_X = np.zeros((0, len(Reservation)), dtype=np.int64)  # no expandable reservations in CuPy's pool


@plain(inline="always")
def _passes(S, value, limit):  # pragma: no cover - compiled
    return limit_test.passes(S, value, limit, Slot.ASKED, Slot.PASSED, Slot.REFUSED)


@njit(cache=True, error_model="numpy")
def _try_malloc(C, S, R, i, s, limit, dev_total, stream):  # pragma: no cover - compiled
    # The limit enters the replay only in these three tests (``limit_test``): the replay says
    # at which limits it replays alike.
    if not _passes(S, s, limit):
        return False
    if not _passes(S, S[Slot.RESERVED] + s, limit):
        sg.release_all_whole(C, S, R, i, stream)
        if not _passes(S, S[Slot.RESERVED] + s, limit):
            return False
    if dev_total > 0 and S[Slot.DEV_USED] + sg.device_cost(s) > dev_total:
        sg.release_all_whole(C, S, R, i, stream)
        if S[Slot.DEV_USED] + sg.device_cost(s) > dev_total:
            return False
    return True


@plain(error_model="numpy")
def _cached(C, S, a, s, ties, recorded):  # pragma: no cover - compiled
    """The best-fitting free block of arena a for s bytes (-1: none), the one at the recorded
    address among equal sizes where ``ties`` (CuPy breaks size ties by host object address)."""
    x = ck.lower_bound(C, S, a, s)
    if x == -1 or C[x, F.GROUP] != a:
        return -1
    if ties and C[x, F.ADDR] != recorded:
        y = ck.find_free(C, S, a, C[x, F.SIZE], recorded)
        if y != -1:
            return y
    return x


@plain(error_model="numpy")
def _stood_in(i, kind, rep, holder, addr, rounded, status, blk):  # pragma: no cover - compiled
    """Row i done by the handled attempt standing in for it, or skipped (``prepare.stand_in``): True;
    False: row i is placed as usual."""
    h = stand_in(kind, rep, holder, i)
    if h >= 0:  # a served handled attempt stands in for this malloc: its block
        blk[i] = blk[h]
        if addr.shape[0] > 0:
            addr[i] = addr[h]
            rounded[i] = rounded[h]
    if h != -1:
        status[i] = Status.DONE if h >= 0 else Status.TRIED
        return True
    return False


@plain(error_model="numpy")
def _easy_row(i, op, kind, rep, holder, size, arena, mate, init, init_addr, rel, cfg, C, R, S, addr, rounded,
              status, blk):  # pragma: no cover - compiled
    """Replay row i where that makes no array: a free, a malloc that a cached block serves, a stand-in,
    a request of 0 bytes. False, having changed nothing: the row needs more (``_hard_row``)."""
    if init[i]:
        return True
    if rel[i] != NO_RELEASE:
        return False
    kd = kind[i]
    if _stood_in(i, kind, rep, holder, addr, rounded, status, blk):
        return True
    if kd == Kind.ALLOC or kd == Kind.TRY:
        s = (size[i] + 511) // 512 * 512
        if s == 0 or ck.short_of_room(C, S, 4) or ck.short_of_rows(R, S, S[Slot.NALIVE] + 4):
            return False
        x = _cached(C, S, arena[i], s, cfg[CupySetting.TIES] != 0, init_addr[i])
        if x == -1:  # a new allocation: ``_hard_row``
            return False
        if addr.shape[0] > 0:
            rounded[i] = s
        ck.take_front(C, S, x, s)
        ck.placed(C, S, i, x, kd, rep, holder, addr, status, blk)
    elif op[i] == Op.FREE:
        ck.free_request(C, S, blk, status, mate, i)
    return True


@plain(error_model="numpy")
def _easy_rows(i, op, kind, rep, holder, size, arena, mate, init, init_addr, rel, cfg, C, R, S, addr, rounded,
               status, blk):  # pragma: no cover - compiled
    """Replay rows from i while ``_easy_row`` can: the first row it could not (n: none); a loop that
    counts no references (``_torch_kernel._easy_rows`` says why)."""
    n = op.shape[0]
    while i < n:
        if not _easy_row(i, op, kind, rep, holder, size, arena, mate, init, init_addr, rel, cfg, C, R, S,
                         addr, rounded, status, blk):
            return i
        i += 1
    return n


@njit(cache=True, error_model="numpy", nogil=True)
def _hard_row(i, op, kind, rep, holder, size, arena, mate, init, init_addr, rel, hints, stream, cfg, C, R, S,
              stats, addr, rounded, status, blk):  # pragma: no cover - compiled
    """Replay row i, whatever it needs (a new allocation, a release, C or R grown): (C, R, stop), the
    matrices as they are now and whether the replay stops here (a fatal OOM)."""
    limit = cfg[CupySetting.LIMIT]
    dev_total = cfg[CupySetting.DEVICE_TOTAL]
    outputs = addr.shape[0] > 0
    o = op[i]
    if init[i]:
        return C, R, False
    if rel[i] != NO_RELEASE:  # the program (or a retry) released cached memory here
        if ck.short_of_rows(R, S, S[Slot.NALIVE] + 4):
            R = ck.rows_room(R, S, S[Slot.NALIVE] + 4)
        sg.release_whole_in(C, S, R, i, stream, rel[i])
    kd = kind[i]
    if _stood_in(i, kind, rep, holder, addr, rounded, status, blk):
        return C, R, False
    if kd == Kind.ALLOC or kd == Kind.TRY:
        s = (size[i] + 511) // 512 * 512
        if outputs:
            rounded[i] = s
        if s == 0:  # CuPy returns a null pointer without touching the pool
            status[i] = Status.DONE
            blk[i] = -1
            return C, R, False
        if ck.short_of_room(C, S, 4):
            C = ck.room(C, S, 4)
        if ck.short_of_rows(R, S, S[Slot.NALIVE] + 4):
            R = ck.rows_room(R, S, S[Slot.NALIVE] + 4)
        a = arena[i]
        x = _cached(C, S, a, s, cfg[CupySetting.TIES] != 0, init_addr[i])
        if x != -1:
            ck.take_front(C, S, x, s)
        elif _try_malloc(C, S, R, i, s, limit, dev_total, stream):
            at = sg.recorded_addr(C, S, NO_X, i, s, hints, True)
            x = sg.add_segment(C, S, R, i, at, s, a, stream[a])
        elif kd == Kind.TRY:  # the program survived this failure: it goes on
            status[i] = Status.OOM
            stats[Stat.HANDLED] += 1
            return C, R, False
        else:
            status[i] = Status.OOM
            ck.note_oom(C, S, i, a, s, stats)
            if cfg[CupySetting.CONTINUE] == 0:
                return C, R, True
            return C, R, False
        ck.placed(C, S, i, x, kd, rep, holder, addr, status, blk)  # its size is s, split or new
    elif o == Op.FREE:
        ck.free_request(C, S, blk, status, mate, i)
    return C, R, False


@njit(cache=True, error_model="numpy", nogil=True)  # nogil: advise replays settings in threads
def cupy_replay(op, kind, rep, holder, size, arena, mate, init, init_addr, rel, hints, stream, cfg,
                C, R, S, stats, addr, rounded, status, blk):  # pragma: no cover - compiled
    """Replay every event; ``cfg`` is the ``CupySetting`` vector. The per-event arrays are the
    caller's, as ``_torch_kernel.torch_replay`` takes them; ``rounded`` (each malloc's size
    rounded to 512 B) is an output like ``addr``, empty where neither is wanted."""
    n = op.shape[0]
    outputs = addr.shape[0] > 0
    # Starting state (rows marked initial): device allocations first, then live blocks; the rows
    # found in one tight pass (a loop over every row that may grow C and R costs tens of ns a row).
    start = np.flatnonzero(init)
    for j in start:
        if op[j] == Op.SEGMENT_ALLOC:
            if ck.short_of_room(C, S, 4):
                C = ck.room(C, S, 4)
            if ck.short_of_rows(R, S, 4):
                R = ck.rows_room(R, S, 4)
            x = sg.add_segment(C, S, R, j, init_addr[j], size[j], arena[j], stream[arena[j]])
            ck.insert_free(C, S, x)
    for j in start:
        if op[j] == Op.MALLOC:
            if ck.short_of_room(C, S, 4):
                C = ck.room(C, S, 4)
            if ck.short_of_rows(R, S, 4):
                R = ck.rows_room(R, S, 4)
            s = (size[j] + 511) // 512 * 512
            x = sg.place_at(C, S, R, j, init_addr[j], s, arena[j], stream)
            blk[j] = x
            if outputs:
                addr[j] = init_addr[j]
                rounded[j] = s
            status[j] = Status.DONE
            ck.add_live(S, s)
    i = 0
    while i < n:
        # The rows that make no array, in a loop that counts no references (``_easy_rows``); the
        # others one at a time (``_hard_row``: a new allocation, a release, C or R grown).
        i = _easy_rows(i, op, kind, rep, holder, size, arena, mate, init, init_addr, rel, cfg, C, R, S, addr,
                       rounded, status, blk)
        if i >= n:
            break
        C, R, stop = _hard_row(i, op, kind, rep, holder, size, arena, mate, init, init_addr, rel, hints,
                               stream, cfg, C, R, S, stats, addr, rounded, status, blk)
        if stop:
            break
        i += 1
    return C, R
