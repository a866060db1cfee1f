"""Whole call stacks, interned: a frame table and a stack table (trace format v3).

A *frame* is one place in the code: ``(file, line, function, kind)``. A *stack* is a frame
called from a parent stack: stack ``s`` = frame ``frame[s]`` called from stack
``parent[s]`` (-1: the outermost frame). Each event names one stack id (-1: none), so a
trace of 10 million events with a few thousand distinct paths through the code stores a
few thousand stacks, each one frame and one parent, whatever the depth. The innermost
frame of a stack is ``frame[s]``; walking ``parent`` goes outwards. ``parent[s] < s``
always (a parent is interned before its children), which keeps every walk finite.

``kind`` says where a frame's code lives, as the recorder or the importer saw it:
``USER`` (the working directory, the program's folder or anywhere else), ``LIBRARY``
(an installed package: site-packages, dist-packages), ``STDLIB`` (Python's own
library) or ``NATIVE`` (a C/C++ frame of a PyTorch snapshot). The user's own line of an
event is its innermost ``USER`` frame; ``UserCode`` lets a user say otherwise
(``--user-code PATH``: frames under PATH are theirs, every other frame is not).

Traces of formats 1 and 2 carry one frame per event (the ``site`` string
``path:line:function``); ``StackTable.from_sites`` reads them as one-frame stacks whose
ids are the site ids, so every reader sees one model.

On disk (``docs/trace-format.md``): the Parquet column ``stack`` (int32, null = none) and
the metadata key ``tracekit.stacks`` holding ``StacksJSON``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TypedDict

import numpy as np

META_KEY = b"tracekit.stacks"  # the Parquet key-value metadata key of StacksJSON
NONE = -1  # the stack id (and parent id) meaning "no stack" / "outermost"


class FrameKind(IntEnum):
    """Where a frame's code lives (uint8 in the frame table)."""

    USER = 0
    LIBRARY = 1
    STDLIB = 2
    NATIVE = 3


class FramesJSON(TypedDict):
    """Column-wise frame table: frame ``i`` is (file[i], line[i], function[i], kind[i])."""

    file: list[str]
    line: list[int]  # -1 when unknown
    function: list[str]
    kind: list[int]  # FrameKind


class StackLinksJSON(TypedDict):
    """Column-wise stack table: stack ``s`` = frame ``frame[s]`` called from stack ``parent[s]``."""

    frame: list[int]
    parent: list[int]  # -1: outermost


class StacksJSON(TypedDict):
    """The value of the ``tracekit.stacks`` metadata key."""

    frames: FramesJSON
    stacks: StackLinksJSON


@dataclass(frozen=True)
class Frame:
    """One frame: ``file:line`` in ``function``; ``line`` -1 when unknown."""

    file: str
    line: int
    function: str
    kind: FrameKind

    def label(self) -> str:
        """``path:line:function``, the form of a format-1/2 call-site (``path:function`` without a line)."""
        if self.line < 0:
            return f"{self.file}:{self.function}"
        return f"{self.file}:{self.line}:{self.function}"

    def short(self) -> str:
        """``path:line`` (``path`` alone without a line), for ``a → b`` chains."""
        return f"{self.file}:{self.line}" if self.line >= 0 else self.file


@dataclass(frozen=True, eq=False)
class StackTable:
    """The interned frames and stacks of one trace, as columns (no Python object per event)."""

    file: tuple[str, ...]
    line: np.ndarray  # int32 per frame
    function: tuple[str, ...]
    kind: np.ndarray  # uint8 per frame (FrameKind)
    frame: np.ndarray  # int32 per stack: its innermost frame
    parent: np.ndarray  # int32 per stack: the stack it was called from, -1 outermost

    @property
    def n_frames(self) -> int:
        return len(self.file)

    @property
    def n_stacks(self) -> int:
        return len(self.frame)

    def frame_at(self, f: int) -> Frame:
        return Frame(self.file[f], int(self.line[f]), self.function[f], FrameKind(int(self.kind[f])))

    def walk(self, stack: int) -> Iterator[int]:
        """The frame ids of ``stack``, innermost first (nothing for -1)."""
        s = stack
        while s >= 0:
            yield int(self.frame[s])
            s = int(self.parent[s])

    def frames(self, stack: int) -> list[Frame]:
        """The frames of ``stack``, innermost first."""
        return [self.frame_at(f) for f in self.walk(stack)]

    def depth(self, stack: int) -> int:
        return sum(1 for _ in self.walk(stack))

    @classmethod
    def empty(cls) -> StackTable:
        return cls.build([], [], [], [], [], [])

    @classmethod
    def build(cls, file: Sequence[str], line: Sequence[int], function: Sequence[str],
              kind: Sequence[int], frame: Sequence[int], parent: Sequence[int]) -> StackTable:
        """A table from columns; raises ValueError when they disagree (the reader words it)."""
        t = cls(tuple(file), np.asarray(line, np.int32), tuple(function), np.asarray(kind, np.uint8),
                np.asarray(frame, np.int32), np.asarray(parent, np.int32))
        t.check()
        return t

    def check(self) -> None:
        """Raise ValueError unless the columns are consistent: equal lengths, frame ids in range,
        known kinds, every parent an earlier stack (so every walk ends)."""
        nf, ns = self.n_frames, self.n_stacks
        if not (len(self.line) == len(self.function) == len(self.kind) == nf):
            raise ValueError("the frame table's columns differ in length")
        if len(self.parent) != ns:
            raise ValueError("the stack table's columns differ in length")
        if nf and int(self.kind.max()) > max(FrameKind):
            raise ValueError("a frame has an unknown kind")
        if ns and (int(self.frame.min()) < 0 or int(self.frame.max()) >= nf):
            raise ValueError("a stack names a frame that is not in the frame table")
        earlier = self.parent < np.arange(ns, dtype=np.int32)
        if not bool(np.all(earlier)) or bool(np.any(self.parent < NONE)):
            raise ValueError("a stack's parent is not an earlier stack")

    @classmethod
    def from_sites(cls, sites: Sequence[str]) -> StackTable:
        """Format 1/2 call-sites as one-frame stacks: stack ``i`` is site ``i`` (``path:line:function``,
        line -1 and the whole text as the file where it does not parse). Kind: ``LIBRARY`` for a path
        that looks installed (``site-packages``/``dist-packages``), else ``USER``."""
        file, line, function, kind = [], [], [], []
        for s in sites:
            f, ln, fn = parse_site(s)
            file.append(f)
            line.append(ln)
            function.append(fn)
            kind.append(int(guess_kind(f)))
        n = len(file)
        return cls.build(file, line, function, kind, range(n), [NONE] * n)

    def to_json(self) -> StacksJSON:
        return StacksJSON(
            frames=FramesJSON(file=list(self.file), line=self.line.tolist(), function=list(self.function),
                              kind=self.kind.tolist()),
            stacks=StackLinksJSON(frame=self.frame.tolist(), parent=self.parent.tolist()),
        )


def parse_site(site: str) -> tuple[str, int, str]:
    """``path:line:function`` -> (path, line, function); (site, -1, "") where it does not parse."""
    parts = site.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), parts[2]
    return site, -1, ""


_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def guess_kind(path: str) -> FrameKind:
    """The kind of a frame known only by its path: installed packages are ``LIBRARY``, else ``USER``."""
    p = f"{os.sep}{path}"
    return FrameKind.LIBRARY if any(m in p for m in _INSTALLED) else FrameKind.USER


@dataclass(frozen=True)
class UserCode:
    """What counts as the user's code: by default every ``USER`` frame; with ``prefixes`` (from
    ``--user-code PATH``, as given and made absolute), exactly the frames whose file starts with one."""

    prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, paths: Sequence[str]) -> UserCode:
        out: list[str] = []
        for p in paths:
            for q in (os.path.normpath(p), os.path.abspath(p)):
                q = q.rstrip(os.sep) if q != os.sep else q
                if q not in out and q != ".":
                    out.append(q)
        return cls(tuple(out))

    def mask(self, table: StackTable) -> np.ndarray:
        """bool per frame: the frame is the user's code."""
        if not self.prefixes:
            return table.kind == FrameKind.USER
        return np.array([self.holds(f) for f in table.file], dtype=bool)

    def holds(self, file: str) -> bool:
        if not self.prefixes:
            return guess_kind(file) is FrameKind.USER
        return any(file == p or file.startswith(p + os.sep) or p in ("", ".") for p in self.prefixes)
