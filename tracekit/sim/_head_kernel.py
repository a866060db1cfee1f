"""The compiled loops of ``tracekit.sim.head_start``: each window's frees paired with their mallocs
as it is read (in the reader's table of live allocations, ``tracekit.trace.live_table``), and the
check that what was replayed agrees with the trace as read. The entry points let go of the GIL:
they run in the head start's threads, beside the reader."""

from __future__ import annotations

from tracekit.compiled import plain
from tracekit.sim.codes import Kind
from tracekit.trace.live_table import EMPTY, remove, slot, tag_of, too_full
from tracekit.trace.schema import Op

SIZE_CLAMP = 1 << 62  # as ``tracekit.sim.prepare``: larger requests are clamped there, so they stop here


@plain(nogil=True)
def pair(op, addr, device, size, lo, hi, kind, mate, keys, tags, vals, state):  # pragma: no cover
    """Rows lo..hi: ``kind`` (``Kind``) and, for a free, ``mate`` (its malloc), through the table of
    live blocks (``keys``/``tags``/``vals``; ``state``: [live, most live, used slots]). Returns (the
    first row the head start cannot replay, -1 for none; the row to go on from, hi at the end).
    It stops early where an allocation left the table too full: the caller grows the table
    (``live_table.grow``, which makes arrays: a ``plain`` kernel makes none, and counts no
    references, ``tracekit.compiled``) and calls again from that row."""
    for i in range(lo, hi):
        o = op[i]
        if o == Op.MALLOC or o == Op.FREE:
            mask = keys.shape[0] - 1
            j = slot(keys, tags, addr[i], tag_of(device[i], False), mask)
            live = tags[j] != EMPTY
            if o == Op.MALLOC:
                if live or size[i] >= SIZE_CLAMP:  # a malloc the reader drops, a size prepare clamps
                    return i, hi
                keys[j] = addr[i]
                tags[j] = tag_of(device[i], False)
                vals[j] = i
                kind[i] = Kind.ALLOC
                mate[i] = -1
                state[0] += 1
                state[1] = max(state[1], state[0])
                state[2] += 1
                if too_full(state[2], keys.shape[0]):
                    return -1, i + 1
            else:
                if not live:
                    return i, hi  # a free of no live block: the reader drops it
                kind[i] = Kind.FREE
                mate[i] = vals[j]
                remove(keys, tags, vals, j, mask)
                state[0] -= 1
                state[2] -= 1
        elif o == Op.SEGMENT_ALLOC or o == Op.SEGMENT_FREE:
            kind[i] = Kind.OTHER
            mate[i] = -1
        else:  # an oom row (handled or not: known once the read ends) or an unknown code
            return i, hi
    return -1, hi


@plain(nogil=True)
def agrees(kind, size, mate, t_kind, t_size, t_mate, p):  # pragma: no cover - compiled
    """Rows 0..p replay alike from (kind, size, mate) and from the trace's (t_*): the same kinds,
    the same request sizes, the same malloc for every free."""
    for i in range(p):
        k = kind[i]
        if k != t_kind[i]:
            return False
        if k == Kind.ALLOC and size[i] != t_size[i]:
            return False
        if k == Kind.FREE and mate[i] != t_mate[i]:
            return False
    return True
