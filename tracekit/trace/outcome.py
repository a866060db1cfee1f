"""How the recorded program ended: which OOM it died of, and which ones it survived.

A fact about the trace, read from its events and its ``exit`` metadata, that every stage
below analysis needs too (the simulator replays a survived OOM as what the program did
instead; advise and export name the fatal one). The fatal OOM, in order of evidence:

1. ``exit.oom_seq`` (trace format v2): the ``oom`` row whose error ended the program;
2. a version 1 ``exit`` whose message is the message of an ``ooms`` entry: that entry's seq;
3. an ``exit`` saying the program ended normally, by a signal, or by an exception that is
   not an out-of-memory error: none, every OOM was survived;
4. otherwise: the last OOM after which the program made no successful allocation on the
   same device and stream (a program that went on allocating there survived the error).

Every other OOM is *handled* (``handled_rows``). ``tracekit.analysis.fatal`` says who
handled them.

The limit the run was held to where it failed (``held_limit``) is read here too: a program may set
its own limit after recording began (CuPy's ``set_limit`` at the top of a script), so the limit at
the start (``pool_limit_bytes``) is the last evidence of it, not the first. Where the failing request
was in a pool the program made itself, with a limit of its own (a CuPy ``MemoryPool`` it set a limit
on), ``failing_pool`` names that pool and that limit instead: no setting of the default pool answers it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.trace.events import Events
from tracekit.trace.recorded import (
    DEFAULT_LABELS,
    MAX_STATES,
    ExitInfo,
    PoolInfo,
    RecordedMeta,
    as_int,
    as_text,
)
from tracekit.trace.schema import Op, TraceMeta

__all__ = ["MAX_STATES", "ExitInfo", "FailingPool", "as_int", "as_text", "default_pool", "failing_pool",
           "failing_row", "fatal_row", "fatal_seq", "handled_rows", "held_limit", "is_own_pool",
           "pool_entry", "pool_limit", "pool_limit_of", "request_bytes", "v1_oom_seq"]

MASKED_KEYS = 8  # distinct (device, stream) pairs of the OOMs searched with one mask each


def v1_oom_seq(recorded: RecordedMeta, ex: ExitInfo) -> int | None:
    """Version 1: the last ``ooms`` entry whose message is the exit exception's message."""
    if ex.message is None:
        return None
    hits = [o.seq for o in recorded.ooms if o.message == ex.message]
    return hits[-1] if hits else None


def fatal_seq(ev: Events, recorded: RecordedMeta | Mapping[str, Any]) -> int | None:
    """The seq of the OOM the program died of, or None when it survived every OOM. ``recorded``:
    the trace's ``TraceMeta.recorded`` (a raw ``extra`` mapping is parsed here)."""
    ooms = np.flatnonzero(ev.op == Op.OOM)
    if len(ooms) == 0:
        return None
    seqs = ev.seq[ooms]
    typed = RecordedMeta.of(recorded)
    ex = typed.exit
    if ex is not None:
        named = [s for s in (ex.oom_seq, v1_oom_seq(typed, ex)) if s is not None and s >= 0]
        for s in named:
            if np.any(seqs == np.uint64(s)):
                return s
        if ex.survived:
            return None
        here = {int(d) for d in np.unique(ev.device[ooms])}
        if any((d := _device_of(typed, s)) is not None and d not in here for s in named):
            return None  # the program died of another device's OOM: these rows are another device's part
    stuck = ooms[~_went_on(ev, ooms)]
    return int(ev.seq[stuck[-1]]) if len(stuck) else None


def fatal_row(ev: Events, recorded: RecordedMeta | Mapping[str, Any]) -> int | None:
    """The row of the OOM the program died of (``fatal_seq``), or None."""
    fatal = fatal_seq(ev, recorded)
    if fatal is None:
        return None
    at = np.flatnonzero(ev.seq == np.uint64(fatal))
    return int(at[0]) if len(at) else None


def failing_row(ev: Events, recorded: RecordedMeta | Mapping[str, Any],
                device: int | None = None) -> int | None:
    """The row of the request the run failed at: the fatal OOM (``fatal_row``), else, where the
    program survived every OOM, the first one; only ``device``'s rows where one is given; None
    without OOMs there."""
    ooms = np.flatnonzero(ev.op == Op.OOM)
    if device is not None:
        ooms = ooms[ev.device[ooms] == device]
    if len(ooms) == 0:
        return None
    row = fatal_row(ev, recorded)
    return row if row is not None and (device is None or int(ev.device[row]) == device) else int(ooms[0])


def pool_limit_of(meta: TraceMeta, device: int | None = None, home: bool | None = None) -> int | None:
    """The limit of ``device``'s default pool as the program left it (bytes; None: none): its
    ``pools`` entry (``default_pool``), where the entry says it (``PoolInfo.limit_known``: the
    recorder writes it at the program's normal end), else, for the ``home`` device the start
    metadata describes, the limit at the start (``pool_limit_bytes``; CuPy's 0 reads as none).
    ``device`` None: the device the start metadata names (``RecordedMeta.home_device``; where it
    names none, device 0, not taken for it); ``home`` None: whether ``device`` is that one."""
    recorded = meta.recorded
    if device is None:
        named = recorded.home_device([])
        device, home = (named, True) if named is not None else (0, False)
    elif home is None:
        home = device == recorded.home_device([device])
    default = default_pool(recorded, device)
    if default is not None and default.limit_known:
        return default.limit
    start = meta.pool_limit_bytes if home else None
    return int(start) if start else None


def pool_limit(meta: TraceMeta, pool_id: int, device: int) -> int | None:
    """The limit of pool ``pool_id`` of ``device`` as recorded (bytes; None: none or not known): the
    default pool's (``default_pool``; on a device without ``pools`` entries, id 0, the recorder's
    number for it) is ``pool_limit_of``'s; any other has the one its ``pools`` entry says (the
    program's end, ``PoolInfo.limit_known``), else the one measured at the last out-of-memory error
    in it (``oom_states``: a recording that was killed). CuPy's 0 reads as none."""
    recorded = meta.recorded
    default = default_pool(recorded, device)
    entry = pool_entry(recorded, pool_id, device)
    # without entries on the device, the default pool is the recorder's 0 and no other id's limit is known
    unlisted = default is None and not any(p.device == device for p in recorded.pools)
    if (default is not None and pool_id == default.id) or (unlisted and pool_id == 0):
        return pool_limit_of(meta, device)
    if entry is not None and entry.limit_known:
        return entry.limit
    measured = [state.pool_limit for o in recorded.ooms
                if o.pool_id == pool_id and o.device in (None, device)
                and (state := recorded.oom_states.get(o.seq)) is not None and state.pool_limit]
    return measured[-1] if measured else None


def default_pool(recorded: RecordedMeta, device: int) -> PoolInfo | None:
    """``device``'s default pool: its ``pools`` entry labelled as the device's own allocator (CuPy's
    default pool, PyTorch's caching allocator: ``DEFAULT_LABELS``); where no entry of the device has
    a label (a trace from before labels), its entry of the lowest id; None where it has no entry, or
    labelled entries none of which is the default pool (a program that used only pools of its own
    there: the recorder numbers pools by first use, so on a device other than the first one of
    those may have the lowest id)."""
    mine = [p for p in recorded.pools if p.device == device]
    if any(p.label is not None for p in mine):
        mine = [p for p in mine if p.label in DEFAULT_LABELS]
    return min(mine, key=lambda p: p.id, default=None)


def held_limit(ev: Events, meta: TraceMeta, device: int | None = None) -> int | None:
    """The allocator limit the run was held to (bytes; None: none found), on ``device`` (default: the
    failing request's, else the events' one device, else the home device): the limit of the default
    pool measured at the failing request (its ``oom_states`` entry; not where another pool of the
    program's raised it, which no setting of the default pool answers), else the device's default
    pool's limit as the program left it (``pool_limit_of``). A limit the program set itself after
    recording began is found either way; ``pool_limit_bytes`` alone would miss it."""
    recorded = meta.recorded
    row = failing_row(ev, recorded, device)
    if row is not None:
        seq = int(ev.seq[row])
        device = int(ev.device[row]) if device is None else device
        state = recorded.oom_states.get(seq)
        pool = _pool_of(recorded, seq)
        default = default_pool(recorded, device)
        ours = pool is None or default is None or pool == default.id
        if ours and state is not None and state.pool_limit is not None:
            return state.pool_limit
    if device is None:  # the events' one device, else the home device (the sort only for several)
        lo, hi = (int(ev.device.min()), int(ev.device.max())) if len(ev) else (0, 0)
        devices = [lo] if lo == hi else [int(d) for d in np.unique(ev.device)]
        device = lo if len(ev) and lo == hi else recorded.home_device(devices)
    return pool_limit_of(meta, device)


@dataclass(frozen=True)
class FailingPool:
    """The pool of the program's own that the failing request was in (not its device's default pool),
    and the limit the program had set on it there (bytes, > 0)."""

    pool: PoolInfo
    limit: int
    request: int  # the failing request's bytes as the pool rounds them (the trace's ``rounded``)
    total: int | None = None  # the pool's own reserved bytes measured at the OOM (None: not measured)
    used: int | None = None  # of those, the bytes in use (None: not measured)

    @property
    def over_limit(self) -> bool | None:
        """Whether the request would have taken the pool over its limit as measured at the OOM (CuPy
        raises at ``total + request > limit``, after releasing its free blocks in CuPy 14; the same
        error, "limit set to" included, where the device ran out under the limit); None where not
        measured."""
        return None if self.total is None else self.total + self.request > self.limit


def failing_pool(ev: Events, meta: TraceMeta, device: int | None = None) -> FailingPool | None:
    """The failing request's pool (``failing_row``; only ``device``'s rows where one is given) where
    the recorder named it (its ``ooms`` entry's ``pool_id``), it is not its device's default pool and
    its limit is known; else None. The limit: the pool's as measured at that request (its
    ``oom_states`` entry: the hook reads the failing pool's own counters, the same figure as the
    ``ooms`` entry's ``limit``), else the pool's ``pools`` entry where it says the limit
    (``PoolInfo.limit_known``). A pool without a ``pools`` entry is named by its id alone. Whether
    that limit is what failed: ``FailingPool.over_limit``."""
    recorded = meta.recorded
    row = failing_row(ev, recorded, device)
    if row is None:
        return None
    seq, device = int(ev.seq[row]), int(ev.device[row])
    pool_id = _pool_of(recorded, seq)
    if pool_id is None:
        return None
    entry = pool_entry(recorded, pool_id, device)
    if not is_own_pool(recorded, pool_id, device):
        return None
    state = recorded.oom_states.get(seq)
    limit = state.pool_limit if state is not None else None
    if limit is None and entry is not None and entry.limit_known:
        limit = entry.limit
    # CuPy's 0 is no limit: a pool without one ran out of the device, not of its limit
    if not limit:
        return None
    request = request_bytes(ev, row)
    total = state.pool_total if state is not None else None
    used = state.pool_used if state is not None else None
    return FailingPool(entry or PoolInfo(pool_id, device), limit, request, total, used)


def is_own_pool(recorded: RecordedMeta, pool_id: int, device: int) -> bool:
    """Whether pool ``pool_id`` of ``device`` is one the program made itself: not the device's default
    pool where one is known (``default_pool``); where none is, a pool whose entry names it as another
    (without entries, which is the default cannot be told: False)."""
    default = default_pool(recorded, device)
    if default is not None:
        return pool_id != default.id
    entry = pool_entry(recorded, pool_id, device)
    return entry is not None and entry.label is not None and entry.label not in DEFAULT_LABELS


def request_bytes(ev: Events, row: int) -> int:
    """The bytes request ``row`` took as its allocator rounds them (``rounded``, at least ``size``)."""
    return int(max(ev.rounded[row], ev.size[row]))


def pool_entry(recorded: RecordedMeta, pool_id: int, device: int) -> PoolInfo | None:
    """Pool ``pool_id``'s ``pools`` entry on ``device``; None where it has none."""
    return next((p for p in recorded.pools if p.id == pool_id and p.device == device), None)


def _pool_of(recorded: RecordedMeta, seq: int) -> int | None:
    """The pool id the recorder's hook noted for the OOM row ``seq`` (its ``ooms`` entry); None where
    it noted none."""
    return next((o.pool_id for o in recorded.ooms if o.seq == seq and o.pool_id is not None), None)


def _device_of(recorded: RecordedMeta, seq: int) -> int | None:
    """The device of the OOM row ``seq`` as the recorder noted it (``oom_states``, else ``ooms``);
    None where it did not."""
    state = recorded.oom_states.get(seq)
    if state is not None and state.device is not None:
        return state.device
    return next((o.device for o in recorded.ooms if o.seq == seq and o.device is not None), None)


def _went_on(ev: Events, ooms: np.ndarray) -> np.ndarray:
    """For each OOM index: a successful malloc on its device and stream came later.

    Only mallocs after the first OOM matter; the last one per (device, stream) is found
    with one mask per distinct key of the OOMs (a few), else by sorting the keys.
    """
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    mallocs = mallocs[mallocs > ooms[0]]
    odev, ostream = ev.device[ooms].astype(np.int64), ev.stream[ooms].view(np.int64)
    mdev, mstream = ev.device[mallocs].astype(np.int64), ev.stream[mallocs].view(np.int64)
    okeys, inverse = np.unique(np.stack([odev, ostream], axis=1), axis=0, return_inverse=True)
    if len(okeys) <= MASKED_KEYS:
        last = np.array([mallocs[(mdev == d) & (mstream == s)].max(initial=-1) for d, s in okeys], np.int64)
        return last[inverse.reshape(-1)] > ooms
    keys = np.stack([np.r_[mdev, odev], np.r_[mstream, ostream]], axis=1)
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    per_group = np.full(int(group.max()) + 1, -1, np.int64)
    np.maximum.at(per_group, group[: len(mallocs)], mallocs)
    return per_group[group[len(mallocs):]] > ooms


def handled_rows(ev: Events, recorded: RecordedMeta | Mapping[str, Any]) -> np.ndarray:
    """Bool per event: the ``oom`` rows the program survived (every one but the fatal OOM).
    ``recorded`` as for ``fatal_seq``.

    What the program did instead of such a request is in the trace after it (a smaller
    retry, another algorithm, nothing at all), so the request is not part of what the
    program needed: it lives no longer than the retry that replaced it, or not at all.
    """
    oom = ev.op == Op.OOM
    if not oom.any():
        return oom
    fatal = fatal_seq(ev, recorded)
    return oom if fatal is None else oom & (ev.seq != np.uint64(fatal))
