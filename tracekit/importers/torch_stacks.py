"""Whole call stacks of a PyTorch snapshot, interned into the trace's ``StackTable``.

PyTorch keeps a list of frames per history entry and per block (``frames``,
innermost first: C++ frames too under ``stacks="all"``, Python ones only under
``stacks="python"``, what ``record --torch`` asks for). Both readers name each
stack by a *raw key* as they meet it, one per distinct stack and never one
object per entry: the unpickler's lists by the identities of their frame dicts
(``of_frames``), the compiled scanner's by their node in its trie of frames
(``of_nodes``). A raw key holds the stack's frames as content ids (one per
distinct ``(file, line, function)``). ``table`` then interns the raw keys a
trace uses in the order its rows first use them, so both readers give the same
table, the same ids and the same bytes.

What is kept of a frame (``FrameKind``): ``NATIVE`` for a C++ frame (a file that
is not ``.py``/``.pyw`` nor a ``<pseudo-file>``, ``??``, or no file), dropped
unless ``keep_native`` (``import torch --stacks``); ``LIBRARY`` for PyTorch's own
files and installed packages; ``STDLIB`` for Python's own library; ``USER``
otherwise. A file or function that is not a string is kept as ``?``, text beyond
``MAX_FRAME_TEXT_BYTES`` is cut, a line that is not an int in 0 .. 2^31 - 1 is -1
(unknown), and only the innermost ``MAX_DEPTH`` frames of a stack are kept
(the compiled scanner keeps the same).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from tracekit.importers.pickle_kernel import MAX_DEPTH
from tracekit.importers.pickle_scan import ScannedFrames
from tracekit.trace.stacks import (
    MAX_FRAME_TEXT_BYTES,
    MAX_LINE,
    NONE,
    FrameKind,
    StackInterner,
    StackTable,
    guess_kind,
)

# A file of PyTorch itself: an installed package or a source checkout's python tree.
_TORCH_FILE = re.compile(
    r"[/\\](?:site|dist)-packages[/\\]torch[/\\]|^torch[/\\]|[/\\]pytorch[/\\]torch[/\\]"
)
_STDLIB = re.compile(r"[/\\]lib[/\\]python\d+(?:\.\d+)?[/\\]|^<frozen ")
_MAX_CHARS = MAX_FRAME_TEXT_BYTES // 4  # a UTF-8 character is at most 4 bytes


def is_torch_file(filename: str) -> bool:
    """True for frames that are not the user's: PyTorch's own Python files, and native frames.

    ``stacks="all"`` adds C++ frames (``.cpp``/``.h`` sources, shared libraries, ``??``);
    they are never the call-site. A user frame is a ``.py`` file outside PyTorch or
    code without a file (``<stdin>``, ``<string>``, notebook cells).
    """
    return is_native(filename) or bool(_TORCH_FILE.search(filename))


def is_native(filename: str) -> bool:
    """A C++ frame (or one without a file): not a ``.py``/``.pyw`` file nor a ``<pseudo-file>``."""
    return not filename or filename == "??" or not (filename.endswith((".py", ".pyw"))
                                                    or filename.startswith("<"))


def frame_kind(file: str) -> FrameKind:
    """Where a snapshot frame's code lives, by its file name (see the module docstring)."""
    if is_native(file):
        return FrameKind.NATIVE
    if is_torch_file(file) or guess_kind(file) is FrameKind.LIBRARY:
        return FrameKind.LIBRARY
    if _STDLIB.search(file):
        return FrameKind.STDLIB
    return FrameKind.USER


def _text(v: Any) -> str:
    return v[:_MAX_CHARS] if isinstance(v, str) else "?"


def _line(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_LINE else -1


class StackBuilder:
    """Raw stacks as the readers meet them, then the trace's ``StackTable`` (``table``)."""

    def __init__(self, *, keep_native: bool = False) -> None:
        self.keep_native = keep_native
        self.frames: list[tuple[str, int, str, int]] = []  # content id -> (file, line, function, kind)
        self._content: dict[tuple[str, int, str], int] = {}
        self._of_dict: dict[int, int] = {}  # id(frame dict) -> content id, -1 dropped
        self._keep: list[Any] = []  # every frame dict looked up, so no id is reused while this lives
        self.seqs: list[tuple[int, ...]] = []  # raw key -> content ids, innermost first
        self._raw: dict[tuple[int, ...], int] = {}
        self._of_list: dict[tuple[int, ...], int] = {}  # frame dict ids of a list -> raw key
        self._of_node: dict[tuple[int, int], int] = {}  # (id(scan), trie node) -> raw key

    def _frame(self, f: Any) -> int:
        """The content id of a frame dict, -1 when it is not a frame or a dropped native frame."""
        c = self._of_dict.get(id(f))
        if c is None:
            c = -1
            if isinstance(f, dict):
                file = _text(f.get("filename"))
                kind = frame_kind(file)
                if self.keep_native or kind is not FrameKind.NATIVE:
                    key = (file, _line(f.get("line")), _text(f.get("name")))
                    c = self._content.get(key, -1)
                    if c < 0:
                        c = self._content[key] = len(self.frames)
                        self.frames.append((*key, int(kind)))
            self._of_dict[id(f)] = c
            self._keep.append(f)
        return c

    def _key(self, frames: list[Any]) -> int:
        seq = tuple(c for c in map(self._frame, frames[:MAX_DEPTH]) if c >= 0)
        if not seq:
            return NONE
        k = self._raw.get(seq)
        if k is None:
            k = self._raw[seq] = len(self.seqs)
            self.seqs.append(seq)
        return k

    def of_frames(self, frames: Any) -> int:
        """The raw key of an unpickled ``frames`` list (or a scanner's ``ScannedFrames``), -1 none."""
        if isinstance(frames, ScannedFrames):
            frames = frames.whole
        if not frames or not isinstance(frames, list | tuple):
            return NONE
        ids = tuple(map(id, frames))
        k = self._of_list.get(ids)
        if k is None:
            k = self._of_list[ids] = self._key(list(frames))
        return k

    def of_nodes(self, scan: Any, nodes: np.ndarray) -> np.ndarray:
        """int32 raw key per list node of a compiled scan (-1 for a node without frames); the work
        and the memory go by the trie's size, not the number of rows."""
        tnode = scan.stack[nodes] if len(nodes) else np.zeros(0, np.int32)
        lut = np.full(len(scan.trie) + 1, NONE, np.int32)  # the last slot answers -1
        used = np.zeros(len(scan.trie), bool)
        used[tnode[tnode >= 0]] = True
        for t in np.flatnonzero(used).tolist():
            k = self._of_node.get((id(scan), t))
            if k is None:
                k = self._of_node[(id(scan), t)] = self._key([scan.frame(r) for r in scan.trie_frames(t)])
            lut[t] = k
        return lut[tnode]

    def table(self, raw: np.ndarray) -> tuple[np.ndarray, StackTable]:
        """The stack id of each row (``raw`` its raw keys, -1 none) and the table they index, the
        stacks interned in the order the rows first use them (outermost frame first)."""
        interner = StackInterner()
        lut = np.full(len(self.seqs) + 1, NONE, np.int32)  # the last slot answers -1
        for k in first_use(raw, len(self.seqs)).tolist():
            s = NONE
            for c in reversed(self.seqs[k]):
                s = interner.stack_id(interner.frame_id(*self.frames[c]), s)
            lut[k] = s
        return lut[raw], interner.table()


def first_use(keys: np.ndarray, n_keys: int, chunk: int = 1 << 20) -> np.ndarray:
    """The keys 0 .. n_keys - 1 that occur in ``keys`` (-1 none), in the order they first occur; in
    chunks, so the memory goes by the chunk, not by the rows."""
    first = np.full(n_keys, len(keys), np.int64)
    for lo in range(0, len(keys), chunk):
        part = keys[lo:lo + chunk]
        u, i = np.unique(part[part >= 0], return_index=True)
        at = np.flatnonzero(part >= 0)[i] + lo
        first[u] = np.minimum(first[u], at)
    seen = np.flatnonzero(first < len(keys))
    return seen[np.argsort(first[seen], kind="stable")]
