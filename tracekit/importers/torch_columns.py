"""One pass over a PyTorch device trace: entry dicts in, compact NumPy columns out.

The restricted unpickler hands back one dict per history entry; this module
reads each entry once, appends its fields to typed ``array`` buffers (8 bytes
a field, no Python object kept per event) and releases the entry, so the
object tree can be dropped device by device. Frames become a call-site index:
the innermost frame whose file is not part of PyTorch itself (the first frame
when every frame is PyTorch's). Frame dicts are shared between entries in a
snapshot, so sites are cached by the frame object's identity.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.errors import InputError
from tracekit.importers.progress import Progress

# Codes for history actions (not v1 ops: several map to none or to several rows).
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, OOM = range(8)
SKIPPED = -1
ACTIONS = {
    "alloc": ALLOC, "free_requested": FREE_REQUESTED, "free_completed": FREE_COMPLETED,
    "segment_alloc": SEGMENT_ALLOC, "segment_free": SEGMENT_FREE, "segment_map": SEGMENT_MAP,
    "segment_unmap": SEGMENT_UNMAP, "oom": OOM,
}
# A file of PyTorch itself: an installed package or a source checkout's python tree.
_TORCH_FILE = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]torch[/\\]|^torch[/\\]|[/\\]pytorch[/\\]torch[/\\]"
)


def is_torch_file(filename: str) -> bool:
    """True for frames inside PyTorch's own Python files (and for frames with no file)."""
    return not filename or filename == "??" or bool(_TORCH_FILE.search(filename))


@dataclass
class SiteTable:
    """Interns ``path:line:function`` strings; also full stacks when asked to."""

    sites: dict[str, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    stacks: dict[str, int] = field(default_factory=dict)
    _frame: dict[int, tuple[Any, int, bool]] = field(default_factory=dict)
    _stack: dict[tuple[int, ...], int] = field(default_factory=dict)

    def frame_site(self, f: Any) -> tuple[int, bool]:
        """(site index, is a PyTorch frame) of one frame dict, cached by identity."""
        hit = self._frame.get(id(f))
        if hit is not None:
            return hit[1], hit[2]
        if isinstance(f, dict):
            fn, line, name = str(f.get("filename", "")), f.get("line", 0), str(f.get("name", ""))
        else:
            fn, line, name = "", 0, str(f)
        text = f"{fn}:{line}:{name}"
        idx = self.sites.get(text, -1)
        if idx < 0:
            idx = self.sites[text] = len(self.names)
            self.names.append(text)
        self._frame[id(f)] = (f, idx, is_torch_file(fn))  # holding f keeps its id unique
        return idx, is_torch_file(fn)

    def site_of(self, frames: Any) -> int:
        if not frames or not isinstance(frames, list | tuple):
            return -1
        first = -1
        for f in frames:
            idx, internal = self.frame_site(f)
            if not internal:
                return idx
            if first < 0:
                first = idx
        return first

    def stack_of(self, frames: Any) -> int:
        if not frames or not isinstance(frames, list | tuple):
            return -1
        key = tuple(id(f) for f in frames)
        hit = self._stack.get(key)
        if hit is None:
            text = "\n".join(self.names[self.frame_site(f)[0]] for f in frames)
            hit = self.stacks.setdefault(text, len(self.stacks))
            self._stack[key] = hit
        return hit

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
    stack: np.ndarray  # int32, -1 none (only filled when stacks were asked for)
    device_free: np.ndarray  # int64, -1 except oom
    skipped: Counter[str]
    has_time: bool

    def __len__(self) -> int:
        return len(self.action)


def read_history(entries: list[Any], device: int, table: SiteTable, *, stacks: bool = False,
                 progress: Progress | None = None, where: str = "") -> History:
    """Columns of ``entries``; each entry is set to None once read so its memory can go."""
    act, site, stk = array("b"), array("i"), array("i")
    addr, size, stream = array("Q"), array("Q"), array("Q")
    t, dfree = array("q"), array("q")
    skipped: Counter[str] = Counter()
    code = ACTIONS.get
    site_of, stack_of = table.site_of, table.stack_of
    has_time = True
    for i, e in enumerate(entries):
        try:
            a = code(e.get("action"), SKIPPED)
            if a == SKIPPED:
                skipped[str(e.get("action"))] += 1
                continue
            act.append(a)
            addr.append(e.get("addr", 0) or 0)
            size.append(e.get("size", 0) or 0)
            stream.append(e.get("stream", 0) or 0)
            tu = e.get("time_us")
            if tu is None:
                has_time = False
                tu = -1
            t.append(tu)
            dfree.append(e.get("device_free", -1) if a == OOM else -1)
            frames = e.get("frames")
            site.append(site_of(frames))
            stk.append(stack_of(frames) if stacks else -1)
        except (AttributeError, TypeError, OverflowError) as err:
            raise InputError(
                f"{where}: history entry {i} of device {device} is malformed ({type(err).__name__}: {err})"
            ) from None
        entries[i] = None
        if progress is not None and (i & 0xFFFF) == 0:
            progress.update(i)

    def np_of(buf: array, dtype: type) -> np.ndarray:
        return np.frombuffer(buf, dtype=dtype) if len(buf) else np.zeros(0, dtype)

    return History(
        action=np_of(act, np.int8), addr=np_of(addr, np.uint64), size=np_of(size, np.uint64),
        stream=np_of(stream, np.uint64), time_us=np_of(t, np.int64), site=np_of(site, np.int32),
        stack=np_of(stk, np.int32), device_free=np_of(dfree, np.int64), skipped=skipped,
        has_time=has_time,
    )
