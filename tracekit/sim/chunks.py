"""The chunk store of the pool models (CuPy's pool, PyTorch's caching allocator).

Every piece of pool memory (a free chunk, a live block, an unmapped range of an
expandable segment) is one row of an int64 matrix ``C[piece, Field]``. Pieces of
one device allocation are linked in address order (``PREV``/``NEXT``). Free
mapped pieces sit in the free tree, a treap (``tracekit.sim.treap``) whose key
is (GROUP, SIZE, ADDR): a lower bound on (group, s) is best fit with ties to
the lowest address. Unmapped pieces sit in the unmapped tree, keyed (group,
address). A group is a CuPy arena (pool, stream) or a PyTorch (pool, stream)
pair. Free pieces that are a whole non-expandable device allocation are also on
a doubly linked list, so "release every unsplit free chunk" costs the number
released, not the number cached. Emitted allocator rows go to ``R[k, Row]``.
Both matrices grow by doubling; callers reserve room before each event
(``room``/``rows_room``), so no helper ever reallocates. All counters (bytes
live, reserved, peaks, row counts) live in the int64 vector ``S[Slot]``. The
layout's names are in ``tracekit.sim.codes``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from tracekit.compiled import plain
from tracekit.sim import treap
from tracekit.sim.codes import N_FIELDS, N_ROW, N_SLOTS, Kind, Op, Row, Slot, Stat, Status, Tree
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Piece as P
from tracekit.sim.treap import K1, K2, K3, TREE_FIELDS

MIB = 1 << 20
PAGE = 2 * MIB  # the driver's allocation granularity above 1 MiB
ADDR_BASE = 1 << 40  # invented device addresses start here (far from 0 and from real ones)
KEY_MIN = -(1 << 62)  # below every key part (sizes and addresses are >= 0, groups too)
KEY_MAX = 1 << 62


@plain(error_model="numpy", inline="always")
def _root(t):  # pragma: no cover - compiled
    return Slot.ROOT_FREE + t


@plain(error_model="numpy")
def tree_insert(C, S, x, t):  # pragma: no cover - compiled
    """Put piece x in tree t (a ``Tree``); the unmapped tree's key is a copy of (GROUP, ADDR)."""
    o = t * TREE_FIELDS
    if t == Tree.UNMAPPED:
        C[x, o + K1] = C[x, F.GROUP]
        C[x, o + K2] = C[x, F.ADDR]
        C[x, o + K3] = 0
    S[_root(t)] = treap.insert(C, S[_root(t)], x, False, o)


@plain(error_model="numpy")
def tree_remove(C, S, x, t):  # pragma: no cover - compiled
    S[_root(t)] = treap.remove(C, S[_root(t)], x, False, t * TREE_FIELDS)


@plain(error_model="numpy")
def lower_bound(C, S, g, s):  # pragma: no cover - compiled
    """Free tree: the first piece with (group, size) >= (g, s), or -1."""
    return treap.lower_bound(C, S[Slot.ROOT_FREE], g, s, KEY_MIN, 0)


@plain(error_model="numpy")
def find_free(C, S, g, s, a):  # pragma: no cover - compiled
    """Free tree: the piece with key exactly (g, s, a), or -1."""
    return treap.find(C, S[Slot.ROOT_FREE], g, s, a, 0)


@plain(error_model="numpy")
def first_in_group(C, S, g, t):  # pragma: no cover - compiled
    """The smallest key of group g in tree t, or -1."""
    o = t * TREE_FIELDS
    x = treap.lower_bound(C, S[_root(t)], g, KEY_MIN, KEY_MIN, o)
    if x != -1 and C[x, o + K1] != g:
        return -1
    return x


@plain(error_model="numpy")
def last_in_group(C, S, g, t):  # pragma: no cover - compiled
    """The largest key of group g in tree t (free tree: the largest free piece), or -1."""
    o = t * TREE_FIELDS
    x = treap.floor(C, S[_root(t)], g, KEY_MAX, KEY_MAX, o)
    if x != -1 and C[x, o + K1] != g:
        return -1
    return x


@plain(error_model="numpy")
def tree_first(C, S, t):  # pragma: no cover - compiled
    return treap.leftmost(C, S[_root(t)], t * TREE_FIELDS)


@plain(error_model="numpy")
def tree_last(C, S, t):  # pragma: no cover - compiled
    return treap.rightmost(C, S[_root(t)], t * TREE_FIELDS)


@plain(error_model="numpy")
def succ(C, x, t):  # pragma: no cover - compiled
    return treap.successor(C, x, t * TREE_FIELDS)


@plain(error_model="numpy")
def pred(C, x, t):  # pragma: no cover - compiled
    return treap.predecessor(C, x, t * TREE_FIELDS)


def new_state(
    cap: int, rows_cap: int, next_addr: int = ADDR_BASE
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty chunk matrix, row matrix and counters."""
    C = np.zeros((max(cap, 16), N_FIELDS), dtype=np.int64)
    R = np.zeros((max(rows_cap, 16), N_ROW), dtype=np.int64)
    S = np.zeros(N_SLOTS, dtype=np.int64)
    S[Slot.ROOT_FREE] = S[Slot.ROOT_UNMAPPED] = S[Slot.FREELIST] = S[Slot.WHEAD] = S[Slot.HHEAD] = -1
    S[Slot.NEXT_ADDR] = next_addr
    return C, R, S


@plain(error_model="numpy")
def short_of_room(C, S, extra):  # pragma: no cover - compiled
    """Whether ``room`` must grow C for ``extra`` more live pieces. A kernel tests this before it
    calls ``room``: ``room`` makes arrays, so each call counts references to C and S (two atomic
    instructions each way, ``tracekit.compiled``); the test, made per event, counts none."""
    return C.shape[0] - S[Slot.NALIVE] < extra


@plain(error_model="numpy")
def short_of_rows(R, S, extra):  # pragma: no cover - compiled
    """Whether ``rows_room`` must grow R for ``extra`` more rows (``short_of_room`` says why)."""
    return R.shape[0] - S[Slot.NROWS] < extra


@njit(cache=True, error_model="numpy")
def room(C, S, extra):  # pragma: no cover - compiled
    """C with room for ``extra`` more live pieces (a new matrix if it had to grow)."""
    if C.shape[0] - S[Slot.NALIVE] >= extra:
        return C
    n = max(2 * C.shape[0], S[Slot.NALIVE] + extra)
    out = np.zeros((n, N_FIELDS), dtype=np.int64)
    out[: C.shape[0]] = C
    return out


@njit(cache=True, error_model="numpy")
def rows_room(R, S, extra):  # pragma: no cover - compiled
    if R.shape[0] - S[Slot.NROWS] >= extra:
        return R
    out = np.zeros((max(2 * R.shape[0], S[Slot.NROWS] + extra), N_ROW), dtype=np.int64)
    out[: R.shape[0]] = R
    return out


@plain(error_model="numpy")
def emit(R, S, before, op, addr, size, stream):  # pragma: no cover - compiled
    k = S[Slot.NROWS]
    R[k, Row.BEFORE] = before
    R[k, Row.OP] = op
    R[k, Row.ADDR] = addr
    R[k, Row.SIZE] = size
    R[k, Row.STREAM] = stream
    S[Slot.NROWS] = k + 1
    if op == Op.SEGMENT_ALLOC:
        S[Slot.SEGA] += 1
    else:
        S[Slot.SEGF] += 1


@plain(error_model="numpy")
def new_node(C, S, addr, size, group, state):  # pragma: no cover - compiled
    x = S[Slot.FREELIST]
    if x != -1:
        S[Slot.FREELIST] = C[x, F.RECYCLED]
    else:
        x = S[Slot.HW]
        S[Slot.HW] = x + 1
    S[Slot.NALIVE] += 1
    C[x, F.ADDR] = addr
    C[x, F.SIZE] = size
    C[x, F.GROUP] = group
    C[x, F.PREV] = -1
    C[x, F.NEXT] = -1
    C[x, F.STATE] = state
    C[x, F.INW] = 0
    C[x, F.EXP] = -1
    return x


@plain(error_model="numpy")
def kill(C, S, x):  # pragma: no cover - compiled
    C[x, F.STATE] = P.DEAD
    C[x, F.RECYCLED] = S[Slot.FREELIST]
    S[Slot.FREELIST] = x
    S[Slot.NALIVE] -= 1


@plain(error_model="numpy")
def insert_free(C, S, x):  # pragma: no cover - compiled
    """Put piece x in the free tree (and on the whole-allocation list if unsplit)."""
    C[x, F.STATE] = P.FREE
    C[x, F.GCBASE] = S[Slot.GCL]  # PyTorch's gc_count_base: lookups counted when it was cached
    tree_insert(C, S, x, Tree.FREE)
    if C[x, F.PREV] == -1 and C[x, F.NEXT] == -1 and C[x, F.EXP] == -1:
        h = S[Slot.WHEAD]
        C[x, F.INW] = 1
        C[x, F.WPREV] = -1
        C[x, F.WNEXT] = h
        if h != -1:
            C[h, F.WPREV] = x
        S[Slot.WHEAD] = x


@plain(error_model="numpy")
def remove_free(C, S, x):  # pragma: no cover - compiled
    tree_remove(C, S, x, Tree.FREE)
    if C[x, F.INW] == 1:
        p = C[x, F.WPREV]
        nx = C[x, F.WNEXT]
        if p == -1:
            S[Slot.WHEAD] = nx
        else:
            C[p, F.WNEXT] = nx
        if nx != -1:
            C[nx, F.WPREV] = p
        C[x, F.INW] = 0


@plain(error_model="numpy")
def link_after(C, x, r):  # pragma: no cover - compiled
    """Put node r right after x in x's address-ordered list."""
    nx = C[x, F.NEXT]
    C[r, F.PREV] = x
    C[r, F.NEXT] = nx
    if nx != -1:
        C[nx, F.PREV] = r
    C[x, F.NEXT] = r


@plain(error_model="numpy")
def link_before(C, x, f):  # pragma: no cover - compiled
    """Put node f right before x in x's address-ordered list."""
    p = C[x, F.PREV]
    C[f, F.PREV] = p
    C[f, F.NEXT] = x
    if p != -1:
        C[p, F.NEXT] = f
    C[x, F.PREV] = f


@plain(error_model="numpy")
def split_front(C, S, x, s):  # pragma: no cover - compiled
    """Cut x to its first s bytes; the rest becomes a free piece right after it."""
    r = new_node(C, S, C[x, F.ADDR] + s, C[x, F.SIZE] - s, C[x, F.GROUP], P.FREE)
    C[r, F.EXP] = C[x, F.EXP]
    link_after(C, x, r)
    C[x, F.SIZE] = s
    insert_free(C, S, r)
    return r


@plain(error_model="numpy")
def absorb_next(C, S, x):  # pragma: no cover - compiled
    """Merge x's next piece (already out of every tree) into x and drop it."""
    nx = C[x, F.NEXT]
    C[x, F.SIZE] += C[nx, F.SIZE]
    nn = C[nx, F.NEXT]
    C[x, F.NEXT] = nn
    if nn != -1:
        C[nn, F.PREV] = x
    kill(C, S, nx)


@plain(error_model="numpy")
def free_merge(C, S, x):  # pragma: no cover - compiled
    """Return a used piece to the pool, merging with free (mapped) neighbours."""
    nx = C[x, F.NEXT]
    if nx != -1 and C[nx, F.STATE] == P.FREE:
        remove_free(C, S, nx)
        absorb_next(C, S, x)
    p = C[x, F.PREV]
    if p != -1 and C[p, F.STATE] == P.FREE:
        remove_free(C, S, p)
        absorb_next(C, S, p)
        x = p
    insert_free(C, S, x)
    return x


@plain(error_model="numpy")
def add_live(S, size):  # pragma: no cover - compiled
    S[Slot.LIVE] += size
    if S[Slot.LIVE] > S[Slot.PEAK_LIVE]:
        S[Slot.PEAK_LIVE] = S[Slot.LIVE]


@plain(error_model="numpy")
def free_request(C, S, blk, status, mate, i):  # pragma: no cover - compiled
    """Input event i frees the block its malloc got: DONE, or SKIPPED when its malloc failed."""
    m = mate[i]
    if m < 0 or status[m] != Status.DONE:
        status[i] = Status.SKIPPED
        return
    status[i] = Status.DONE
    x = blk[m]
    if x < 0:
        return
    add_live(S, -C[x, F.SIZE])
    free_merge(C, S, x)


@plain(error_model="numpy")
def note_oom(C, S, i, g, s, stats):  # pragma: no cover - compiled
    """Count a failed request of s bytes in group g; the first one also records the pool's state."""
    stats[Stat.OOMS] += 1
    if stats[Stat.FIRST_OOM] < 0:
        stats[Stat.FIRST_OOM] = i
        stats[Stat.OOM_FREE] = S[Slot.RESERVED] - S[Slot.LIVE]
        big = last_in_group(C, S, g, Tree.FREE)
        stats[Stat.OOM_LARGEST] = C[big, F.SIZE] if big != -1 else 0
        stats[Stat.OOM_LIVE] = S[Slot.LIVE]
        stats[Stat.OOM_RESERVED] = S[Slot.RESERVED]
        stats[Stat.OOM_ROUNDED] = s


@plain(error_model="numpy")
def placed(C, S, i, x, kd, rep, holder, addr, status, blk):  # pragma: no cover - compiled
    """Row i's malloc (or handled attempt, ``kd``: a ``Kind``) has block x, taken and split to its
    size: what the row becomes (the pool kernels' common step after a placement)."""
    if kd == Kind.TRY and rep[i] < 0:  # served; nothing replaced it: released at once
        free_merge(C, S, x)
        status[i] = Status.TRIED
        return
    if kd == Kind.TRY:  # served: it lives in place of the retry that replaced it
        holder[rep[i]] = i
    blk[i] = x
    if addr.shape[0] > 0:
        addr[i] = C[x, F.ADDR]
    status[i] = Status.TRIED if kd == Kind.TRY else Status.DONE
    add_live(S, C[x, F.SIZE])


@plain(error_model="numpy")
def take_front(C, S, x, s):  # pragma: no cover - compiled
    """Free piece x in use for its low s bytes; the rest, where there is any, a free piece of its own."""
    remove_free(C, S, x)
    C[x, F.STATE] = P.USED
    if C[x, F.SIZE] > s:
        split_front(C, S, x, s)
