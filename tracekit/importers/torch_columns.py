"""One pass over a PyTorch device trace: entry dicts in, compact NumPy columns out.

The restricted unpickler hands back one dict per history entry; this module
builds each field with one list comprehension over the entries, turns it
into a NumPy column at once (the short-lived list is the only per-entry Python
object) and then empties the entry list, so the object tree can be dropped
device by device. Frames become a call-site index:
the innermost frame whose file is not part of PyTorch itself (the first frame
when every frame is PyTorch's). Frame dicts are shared between entries in a
snapshot, so sites are cached by the frame object's identity. Whole stacks
go to a ``torch_stacks.StackBuilder`` as raw keys (one int per entry).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.errors import InputError
from tracekit.importers import snapshot_policy as policy
from tracekit.importers.pickle_kernel import En
from tracekit.importers.torch_stacks import StackBuilder, is_torch_file
from tracekit.progress import Progress

# Codes for history actions (not v1 ops: several map to none or to several rows).
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM = range(8)
SKIPPED = -1
ACTIONS = {
    "alloc": ALLOC, "free_requested": FREE_REQUESTED, "free_completed": FREE_COMPLETED,
    "segment_alloc": SEGMENT_ALLOC, "segment_free": SEGMENT_FREE, "segment_map": SEGMENT_MAP,
    "segment_unmap": SEGMENT_UNMAP, "oom": OOM,
    "free": FREE_COMPLETED,  # PyTorch 1.13 had one free action, before the requested/completed split
}
@dataclass
class SiteTable:
    """Interns ``path:line:function`` strings.

    ``_code`` maps a frame dict's id to its site index, stored as ``-(index + 2)``
    for PyTorch's own frames so one lookup answers both questions. ``_keep``
    holds every cached frame so no id is reused while the table lives.
    """

    sites: dict[str, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    _code: dict[int, int] = field(default_factory=dict)
    _keep: list[Any] = field(default_factory=list)

    def _add(self, f: Any) -> int:
        if isinstance(f, dict):
            fn, line, name = str(f.get("filename", "")), f.get("line", 0), str(f.get("name", ""))
        else:
            fn, line, name = "", 0, str(f)
        text = f"{fn}:{line}:{name}"
        idx = self.sites.get(text, -1)
        if idx < 0:
            idx = self.sites[text] = len(self.names)
            self.names.append(text)
        code = -(idx + 2) if is_torch_file(fn) else idx
        self._code[id(f)] = code
        self._keep.append(f)
        return code

    def site_of(self, frames: Any) -> int:
        """The innermost frame outside PyTorch (else the innermost frame); -1 without frames."""
        if not frames or not isinstance(frames, list | tuple):
            return -1
        get = self._code.get
        first = 0
        for f in frames:
            c = get(id(f))
            if c is None:
                c = self._add(f)
            if c >= 0:
                return c
            if not first:
                first = c
        return -first - 2

    def site_tuple(self) -> tuple[str, ...]:
        return tuple(self.names)


@dataclass(frozen=True, eq=False)
class History:
    """One device's history as columns (raw action codes, PyTorch's own units)."""

    action: np.ndarray  # int8 action code (SKIPPED rows already removed)
    addr: np.ndarray  # uint64
    size: np.ndarray  # uint64
    stream: np.ndarray  # uint64
    time_us: np.ndarray  # int64, or all -1 when the snapshot has no time_us
    site: np.ndarray  # int32, -1 none
    stack: np.ndarray  # int32 raw stack key (StackBuilder), -1 none
    device_free: np.ndarray  # int64, -1 except oom
    skipped: Counter[str]
    has_time: bool

    def __len__(self) -> int:
        return len(self.action)


def read_history(entries: list[Any], device: int, table: SiteTable, stacks: StackBuilder, *,
                 progress: Progress | None = None, where: str = "") -> History:
    """Columns of ``entries`` (one list comprehension per field); the list is emptied afterwards."""
    policy.check_entries(entries, device, where)
    try:
        cols = _columns(entries, table, stacks)
    except (AttributeError, TypeError, ValueError, OverflowError, KeyError, IndexError,
            RecursionError) as err:
        raise InputError(
            f"{where}: a history entry of device {device} is malformed ({type(err).__name__}: {err})"
        ) from None
    entries.clear()  # the entry dicts can go now
    if progress is not None:
        progress.advance(len(cols))
    return cols


def _columns(entries: list[Any], table: SiteTable, stacks: StackBuilder) -> History:
    code = ACTIONS.get
    # Only strings are looked up or counted: hashing or printing a hostile value (a tuple
    # nested a million deep) would exhaust the C stack.
    names = [a if isinstance(a := e.get("action"), str) else f"<{type(a).__name__}>" for e in entries]
    action = np.array([code(a, SKIPPED) for a in names], dtype=np.int8)
    keep = action != SKIPPED
    skipped = Counter(a[:64] for a, k in zip(names, keep.tolist(), strict=True) if not k)
    del names
    if not keep.all():
        entries = [e for e, k in zip(entries, keep.tolist(), strict=True) if k]
        action = action[keep]

    def u64(key: str) -> np.ndarray:
        return np.array([e.get(key) or 0 for e in entries], dtype=np.uint64)

    addr, size, stream = u64("addr"), u64("size"), u64("stream")
    times = [e.get("time_us") for e in entries]
    has_time = None not in times
    time_us = np.array(times if has_time else [-1 if t is None else t for t in times], dtype=np.int64)
    del times
    oom = np.flatnonzero(action == OOM)
    device_free = np.full(len(entries), -1, np.int64)
    device_free[oom] = [entries[i].get("device_free", -1) for i in oom.tolist()]
    site_of = table.site_of
    frames = [e.get("frames") for e in entries]
    site = np.array([site_of(f) if f else -1 for f in frames], dtype=np.int32)
    stack = np.array([stacks.of_frames(f) for f in frames], dtype=np.int32)
    return History(action=action, addr=addr, size=size, stream=stream, time_us=time_us, site=site,
                   stack=stack, device_free=device_free, skipped=skipped, has_time=has_time)


def read_scanned(entries: Any, table: SiteTable, stacks: StackBuilder, where: str = "") -> History:
    """A History from a compiled scan's entry columns (``pickle_scan.EntryList``), no per-entry object."""
    sc = entries.scan
    col = sc.entries
    rows = np.flatnonzero(col[:, En.LIST] == entries.node)
    sel: Any = slice(None) if len(rows) == len(col) else rows
    act = col[sel, En.ACTION]
    skipped: Counter[str] = Counter()
    for i in np.flatnonzero(act < 0).tolist():
        r = int(rows[i])
        skipped["None" if col[r, En.ACTION] == -2 else
                sc.text(int(col[r, En.ACTION_OFF]), int(col[r, En.ACTION_LEN]))] += 1
    keep = act >= 0
    if not keep.all():
        sel = rows[keep]
    action = col[sel, En.ACTION].astype(np.int8)
    ints = [col[sel, k] for k in (En.ADDR, En.SIZE, En.STREAM)]
    if any(len(c) and int(c.min()) < 0 for c in ints):
        raise InputError(f"{where}: a history entry has a negative address, size or stream")
    clock = col[sel, En.HAS_TIME] == 1
    has_time = bool(np.all(clock))
    time_us = col[sel, En.TIME_US].copy() if has_time else np.where(clock, col[sel, En.TIME_US], -1)
    device_free = np.where(action == OOM, col[sel, En.DEVICE_FREE], -1).astype(np.int64)
    node = col[sel, En.FRAMES]
    site = np.full(len(action), -1, np.int32)
    has = node >= 0
    nd = node[has]
    f = np.where(sc.site[nd] >= 0, sc.site[nd], sc.first[nd])
    with_frames = sc.nfr[nd] > 0
    uniq, inv = np.unique(f[with_frames], return_inverse=True)
    lut = np.array([table.site_of([sc.frame(int(u))]) for u in uniq.tolist()], dtype=np.int32)
    s = np.full(len(nd), -1, np.int32)
    s[with_frames] = lut[inv] if len(uniq) else s[with_frames]
    site[has] = s
    stack = np.full(len(action), -1, np.int32)
    stack[has] = stacks.of_nodes(sc, nd)
    return History(action=action, addr=ints[0].astype(np.uint64), size=ints[1].astype(np.uint64),
                   stream=ints[2].astype(np.uint64), time_us=time_us, site=site,
                   stack=stack, device_free=device_free, skipped=skipped,
                   has_time=has_time)
