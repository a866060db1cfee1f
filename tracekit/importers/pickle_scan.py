"""A compiled reader for snapshot pickles: history entries straight into columns, no object per entry.

The restricted unpickler builds a dict per history entry (about six times the
file's size in memory). ``pickle_kernel._scan`` interprets, in one compiled
pass over the bytes, the opcodes of binary protocols 2 to 5 that a snapshot
uses (containers, ints, floats, strings, bytes, the memo) without calling
anything: a dict that receives an ``action`` key is a history entry and its
fields go to columns; a dict with a ``filename`` key is a stack frame, kept
once; a list of frames keeps only its first frame and its innermost frame
outside PyTorch (all the call-site needs) and its node in a trie of frames,
interned as the scan goes (the whole stack, ``torch_stacks``). This module turns the rest back
into builtin objects (``Scan``) and hands each device's history on as an
``EntryList``. Any opcode or shape outside that subset makes ``scan`` return
None, and the caller falls back to the restricted unpickler, which then also
gives the error message for a hostile or broken file.
"""

from __future__ import annotations

import struct
import threading
from typing import Any

import numpy as np

from tracekit.importers.pickle_kernel import (
    Cap,
    Ed,
    Fr,
    Kind,
    Nd,
    Tag,
    Tr,
    _scan,
)


class EntryList:
    """A device's history as found by ``scan``: the rows of the entry columns that belong to it."""

    def __init__(self, scan: Scan, node: int) -> None:
        self.scan, self.node = scan, node

    def __len__(self) -> int:
        return int(self.scan.node_entries[self.node])


class ScannedFrames(list[dict[str, Any]]):
    """A stack as ``scan`` gives it outside the history (segments, blocks): the call-site frame
    alone, and ``whole``, all its frames kept (innermost first). It holds no reference to the
    scan, whose arrays can go once the history is read."""

    def __init__(self, frames: list[dict[str, Any]], whole: list[dict[str, Any]]) -> None:
        super().__init__(frames)
        self.whole = whole


class Scan:
    """The arrays ``_scan`` returns, and their translation back into builtin objects."""

    def __init__(self, buf: np.ndarray, out: tuple[Any, ...]) -> None:
        _, _, self.st_t, self.st_a, self.st_b, nd, ed, self.entries, self.frames, self.trie = out
        self.kind, self.aux = nd[:, Nd.KIND], nd[:, Nd.AUX]
        self.first, self.site = nd[:, Nd.FIRST], nd[:, Nd.SITE]
        self.nfr, self.node_entries, self.stack = nd[:, Nd.N_FRAMES], nd[:, Nd.N_ENTRIES], nd[:, Nd.STACK]
        ep = ed[:, Ed.PARENT]
        self.ekt, self.eka, self.ekb = ed[:, Ed.KEY_TAG], ed[:, Ed.KEY_A], ed[:, Ed.KEY_B]
        self.evt, self.eva, self.evb = ed[:, Ed.VALUE_TAG], ed[:, Ed.VALUE_A], ed[:, Ed.VALUE_B]
        self.buf = buf
        order = np.argsort(ep, kind="stable")
        nodes, start, count = np.unique(ep[order], return_index=True, return_counts=True)
        self.order = order
        self.span = dict(zip(nodes.tolist(), zip(start.tolist(), (start + count).tolist(), strict=True),
                             strict=True))  # node -> its edges in ``order``; only nodes that have some
        self._frame_objs: dict[int, dict[str, Any]] = {}
        self._whole: dict[int, list[dict[str, Any]]] = {}

    def text(self, off: int, ln: int) -> str:
        raw = bytes(self.buf[off:off + ln])
        try:
            return raw.decode("utf-8", "surrogatepass")  # as the unpickler decodes it
        except UnicodeDecodeError:  # not UTF-8 at all (a hostile file): keep what can be read
            return raw.decode("utf-8", "replace")

    def frame(self, f: int) -> dict[str, Any]:
        obj = self._frame_objs.get(f)
        if obj is None:
            row = self.frames[f].tolist()
            line = row[Fr.LINE]
            if row[Fr.BIG]:
                line = self.value(Tag.BIGINT, line, row[Fr.LINE_LEN])
            obj = {"filename": self.text(row[Fr.FILE_OFF], row[Fr.FILE_LEN]), "line": line,
                   "name": self.text(row[Fr.NAME_OFF], row[Fr.NAME_LEN])}
            self._frame_objs[f] = obj
        return obj

    def whole(self, t: int) -> list[dict[str, Any]]:
        """The frames of trie node ``t``, innermost first; one list per distinct stack, shared."""
        got = self._whole.get(t)
        if got is None:
            got = self._whole[t] = [self.frame(r) for r in self.trie_frames(t)]
        return got

    def trie_frames(self, t: int) -> list[int]:
        """The frame rows of trie node ``t``, innermost first (nothing for -1)."""
        rows: list[int] = []
        inner = self.trie[:, Tr.INNER]
        frame = self.trie[:, Tr.FRAME]
        while t >= 0:
            rows.append(int(frame[t]))
            t = int(inner[t])
        rows.reverse()  # the walk goes from the outermost frame inwards
        return rows

    def root(self) -> Any:
        return self.value(int(self.st_t[0]), int(self.st_a[0]), int(self.st_b[0]))

    def value(self, t: int, a: int, b: int) -> Any:
        if t == Tag.NONE:
            return None
        if t == Tag.BOOL:
            return bool(a)
        if t == Tag.INT:
            return a
        if t == Tag.FLOAT:
            return struct.unpack(">d", struct.pack(">q", a))[0]
        if t == Tag.STR:
            return self.text(a, b)
        if t == Tag.BYTES:
            return bytes(self.buf[a:a + b])
        if t == Tag.BIGINT:
            return int.from_bytes(bytes(self.buf[a:a + b]), "little", signed=True)
        return self.node(a)

    def node(self, nd: int) -> Any:
        kind = int(self.kind[nd])
        lo, hi = self.span.get(nd, (0, 0))
        idx = self.order[lo:hi].tolist()
        if kind == Kind.FRAME:
            return self.frame(int(self.aux[nd]))
        if kind == Kind.ENTRY:
            raise _Unsupported("a history entry outside a device's list")
        if kind == Kind.DICT:
            kt, ka, kb = self.ekt[idx].tolist(), self.eka[idx].tolist(), self.ekb[idx].tolist()
            vt, va, vb = self.evt[idx].tolist(), self.eva[idx].tolist(), self.evb[idx].tolist()
            return {self.value(*k): self.value(*v)
                    for k, v in zip(zip(kt, ka, kb, strict=True), zip(vt, va, vb, strict=True), strict=True)}
        items = [self.value(t, a, b) for t, a, b in zip(self.evt[idx].tolist(), self.eva[idx].tolist(),
                                                          self.evb[idx].tolist(), strict=True)]
        if kind == Kind.TUPLE:
            return tuple(items)
        if self.nfr[nd]:  # a stack: its first frame and the innermost one outside PyTorch suffice
            if items or self.node_entries[nd]:
                raise _Unsupported("a list mixing frames and other values")
            f = int(self.site[nd]) if self.site[nd] >= 0 else int(self.first[nd])
            return ScannedFrames([self.frame(f)], self.whole(int(self.stack[nd])))
        if self.node_entries[nd]:
            if items:
                raise _Unsupported("a list mixing history entries and other values")
            return EntryList(self, nd)
        return items


class _Unsupported(Exception):
    pass


def scan(buf: np.ndarray, progress: Any = None) -> Any | None:
    """The snapshot in ``buf`` with each device history as an ``EntryList``; None if out of the subset."""
    n = len(buf)
    caps = np.zeros(len(Cap), np.int64)
    # What each array may need per byte of the file (a value takes at least 2 bytes, an entry dozens).
    caps[[Cap.STACK, Cap.MARKS]] = 1 << 14, 1 << 12
    caps[[Cap.MEMO, Cap.NODES, Cap.EDGES]] = n // 8, n // 16, n // 32
    caps[[Cap.ENTRIES, Cap.FRAMES, Cap.TRIE]] = n // 48, n // 64, n // 128
    caps += 1024
    for _ in range(5):  # capacities too small (an unusual file): retry with twice as much
        out = _run(buf, caps, progress)
        if out is None or out[0] != 2:
            break
        caps *= 2
    if out is None or out[0] != 0:
        return None
    try:
        return Scan(buf, out).root()
    except (_Unsupported, RecursionError, UnicodeDecodeError):
        return None


def _run(buf: np.ndarray, caps: np.ndarray, progress: Any) -> tuple[Any, ...] | None:
    """One scan in a worker thread (the compiled code releases the GIL) while progress is shown.

    On Ctrl-C or SIGTERM the worker is told to stop (``pos[1]``) and joined before the
    exception goes on: a process that exits while compiled code still reads ``buf`` (an
    mmap that is closed on the way out) crashes.
    """
    pos = np.zeros(2, np.int64)  # [bytes scanned, stop request]
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(
        _scan(buf, pos, caps)), daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.25)
            if progress is not None:
                progress.update(int(pos[0]))
    except BaseException:
        pos[1] = 1
        worker.join()
        raise
    return box[0] if box else None
