"""Whole call stacks, interned: a frame table and a stack table (trace format v3).

A *frame* is one place in the code: ``(file, line, function, kind)``. A *stack* is a frame
called from a parent stack: stack ``s`` = frame ``frame[s]`` called from stack
``parent[s]`` (-1: the outermost frame). Each event names one stack id (-1: none), so a
trace of 10 million events with a few thousand distinct paths through the code stores a
few thousand stacks, each one frame and one parent, whatever the depth. The innermost
frame of a stack is ``frame[s]``; walking ``parent`` goes outwards. ``parent[s] < s``
always (a parent is interned before its children), which keeps every walk finite.

``kind`` says where a frame's code lives: ``USER`` (the working directory, the program's
folder or anywhere else), ``LIBRARY`` (an installed package, a virtualenv, an array library),
``STDLIB`` (Python's own library) or ``NATIVE`` (a C/C++ frame of a PyTorch snapshot). One
function decides it, ``frame_kind``: the recorder calls it on each frame's absolute path with
the folders the interpreter names as not the user's (``Folders``, the trace's ``environment``
metadata: ``tracekit.trace.schema.Environment``), and the reader calls it again on every
``USER`` frame of a trace it reads (``with_kinds``), with the folders the trace stored where
it has them, so an older or imported trace gets the same answer. The user's own line of an
event is its innermost ``USER`` frame; ``UserCode`` lets a user say otherwise
(``--user-code PATH``: frames under PATH are theirs, every other frame is not).

Traces of formats 1 and 2 carry one frame per event (the ``site`` string
``path:line:function``); ``StackTable.from_sites`` reads them as one-frame stacks whose
ids are the site ids, so every reader sees one model.

On disk (``docs/trace-format.md``): the Parquet column ``stack`` (int32, null = none) and
the metadata key ``tracekit.stacks`` holding ``StacksJSON``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TypedDict, cast

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
    # ASCII digits only (int() refuses some that isdigit() accepts), and a line the int32 column holds
    if len(parts) == 3 and parts[1].isascii() and parts[1].isdigit() and int(parts[1]) <= MAX_LINE:
        return parts[0], int(parts[1]), parts[2]
    return site, -1, ""


MAX_LINE = (1 << 31) - 1  # the frame table's line column is int32


# Top-level packages of the array libraries that allocate: their frames are the allocator's machinery
# (``tracekit.trace.callsite.FRAMEWORKS``: never the request frame, nor the user's code).
ALLOCATORS = frozenset({"torch", "cupy", "cupyx", "cupy_backends", "fastrlock"})
# Top-level packages never the user's code (``frame_kind``): the array libraries, what is built on them
# and what they are built on, and tracekit. Names a program's own folders rarely have: not "cuda",
# "datasets" or "models", which a project may well hold.
LIBRARY_PACKAGES = ALLOCATORS | frozenset({
    "torchvision", "torchaudio", "torchtext", "functorch", "triton", "xformers", "flash_attn",
    "deepspeed", "timm", "lightning", "pytorch_lightning", "transformers", "accelerate", "diffusers",
    "jax", "jaxlib", "flax", "tensorflow", "numpy", "scipy", "numba", "cudf", "rmm", "tracekit",
})
INSTALLED = frozenset({"site-packages", "dist-packages"})  # folders of installed packages, by name
VENV_NAMES = frozenset({".venv", "venv"})  # virtualenv folders, by name
VENV_MARK = "pyvenv.cfg"  # the file every virtualenv's folder holds (PEP 405)
# Folders directly inside a virtualenv that hold its code (a file elsewhere in it, beside pyvenv.cfg,
# may be a project whose folder is also its virtualenv: ``python -m venv .``).
VENV_CODE = frozenset({"lib", "lib64", "bin", "Lib", "Scripts"})
VENV_CACHE = 4096  # folders whose answer _is_venv keeps

# Folders in the order ``frame_kind`` asks them: (the folder with a trailing separator, the kind of the
# code under it); the first holding a path decides. ``tracekit.trace.schema.Environment.folders``.
Folders = tuple[tuple[str, FrameKind], ...]


def frame_kind(path: str, folders: Folders = (), recorded: FrameKind = FrameKind.USER) -> FrameKind:
    """The kind of a frame's code: the one decision of "library or yours" every verb reads.

    ``recorded`` other than ``USER`` stands (the recorder or the importer knew more). Else: Python's
    frozen modules are ``STDLIB``; an absolute path under one of ``folders`` takes the first one's kind
    (the interpreter's word: its site-packages, standard library, the array library, a virtualenv
    inside the program's folder; a ``USER`` folder, the program's or the working directory, answers
    only for what no earlier folder holds); then, for what is left ``USER``, the path as the trace
    names it (the part below that ``USER`` folder) is ``LIBRARY`` when a folder of it is named
    ``site-packages``/``dist-packages``, when it lies in a virtualenv (a ``.venv``/``venv`` folder
    that holds ``pyvenv.cfg`` where it exists on this machine, any such name where it does not, or
    any folder holding ``pyvenv.cfg`` whose ``lib``/``bin`` holds the file), or when its top package
    is one of ``LIBRARY_PACKAGES`` (the first folder of a relative path: ``torch/nn/modules/conv.py``
    of a trace that stored paths relative to site-packages). Why names at all: traces recorded
    before the folders were stored, imported ones and one-frame call-sites carry no folders, and a
    program can put a package folder on ``sys.path`` after the recording started."""
    if recorded is not FrameKind.USER:
        return recorded
    if path.startswith("<"):
        return FrameKind.STDLIB if path.startswith("<frozen") else FrameKind.USER
    rest = path
    if folders and os.path.isabs(path):
        for folder, kind in folders:
            if path.startswith(folder):
                if kind is not FrameKind.USER:
                    return kind
                rest = path[len(folder):]
                break
    return FrameKind.LIBRARY if _library_by_name(path, rest) else FrameKind.USER


def _library_by_name(path: str, rest: str) -> bool:
    """``frame_kind``'s rules on names: ``rest`` is the tail of ``path`` no user's folder explains."""
    parts = rest.replace("\\", "/").split("/")
    dirs = parts[:-1]
    if INSTALLED.intersection(dirs):
        return True
    absolute = os.path.isabs(path)
    top = next((p for p in dirs if p in LIBRARY_PACKAGES), None) if os.path.isabs(rest) else (
        dirs[0] if dirs else None)
    if top in LIBRARY_PACKAGES:
        return True
    if not absolute:
        return bool(VENV_NAMES.intersection(dirs))
    base = path[:len(path) - len(rest)]  # the user's folder (with its separator), or ""
    for i, name in enumerate(dirs):
        if not name:
            continue
        folder = base + "/".join(parts[:i + 1])
        if name in VENV_NAMES:
            if _is_venv(folder) is not False:  # a virtualenv, or a name from a machine not this one
                return True
        elif i + 1 < len(dirs) and dirs[i + 1] in VENV_CODE and _is_venv(folder):
            return True
    return False


@functools.lru_cache(maxsize=VENV_CACHE)
def _is_venv(folder: str) -> bool | None:
    """Whether ``folder`` holds ``pyvenv.cfg``; None where ``folder`` is not a folder on this machine
    (a trace recorded elsewhere). Cached: a stack table names each folder many times, and the rules
    ask only of folders named like a virtualenv or holding ``lib``/``bin``, never of every folder."""
    if not os.path.isdir(folder):  # isdir and isfile answer False for names the system refuses
        return None
    return os.path.isfile(os.path.join(folder, VENV_MARK))


def guess_kind(path: str) -> FrameKind:
    """The kind of a frame known only by its path (a one-frame call-site, an imported frame):
    ``frame_kind`` without folders."""
    return frame_kind(path)


def with_kinds(table: StackTable, folders: Folders = ()) -> StackTable:
    """``table`` with every ``USER`` frame's kind decided again by ``frame_kind`` (``folders``: the
    trace's, where it stored them); the same object where no kind changes. Once per distinct file."""
    kind = table.kind
    users = np.flatnonzero(kind == FrameKind.USER)
    if not len(users):
        return table
    memo: dict[str, int] = {}
    out = kind.copy()
    for f in users.tolist():
        file = table.file[f]
        k = memo.get(file)
        if k is None:
            k = memo[file] = int(frame_kind(file, folders))
        out[f] = k
    if np.array_equal(out, kind):
        return table
    return StackTable(table.file, table.line, table.function, out, table.frame, table.parent)


@dataclass(frozen=True)
class UserCode:
    """What counts as the user's code: by default every ``USER`` frame (``frame_kind``: the kinds a
    trace's table holds once the reader has read it); with ``prefixes`` (from ``--user-code PATH``,
    as given and made absolute), exactly the frames whose file starts with one, whatever their kind."""

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


class StackInterner:
    """Frames and stacks interned as they come: equal frames get one id, equal (frame, parent) pairs
    one stack id, parents always before their children. Merges tables (``add``: concat, the writer's
    batches) and builds one from frames seen live (``frame_id``/``stack_id``: the recorder)."""

    def __init__(self) -> None:
        self._frames: dict[tuple[str, int, str, int], int] = {}
        self._stacks: dict[tuple[int, int], int] = {}
        self.file: list[str] = []
        self.line: list[int] = []
        self.function: list[str] = []
        self.kind: list[int] = []
        self.frame: list[int] = []
        self.parent: list[int] = []

    def frame_id(self, file: str, line: int, function: str, kind: int) -> int:
        key = (file, line, function, kind)
        f = self._frames.get(key)
        if f is None:
            f = self._frames[key] = len(self.file)
            self.file.append(file)
            self.line.append(line)
            self.function.append(function)
            self.kind.append(kind)
        return f

    def stack_id(self, frame: int, parent: int) -> int:
        """The id of frame ``frame`` called from stack ``parent`` (-1 outermost), new if unseen."""
        key = (frame, parent)
        s = self._stacks.get(key)
        if s is None:
            s = self._stacks[key] = len(self.frame)
            self.frame.append(frame)
            self.parent.append(parent)
        return s

    def add(self, table: StackTable) -> np.ndarray:
        """Intern every stack of ``table``; returns int32 ``lut`` of length n_stacks + 1 with
        ``lut[s]`` the id here of ``table``'s stack ``s`` and ``lut[-1] == -1`` (so ``lut[ids]``
        remaps an id column with -1 for none in one step)."""
        flut = [self.frame_id(table.file[f], int(table.line[f]), table.function[f], int(table.kind[f]))
                for f in range(table.n_frames)]
        slut = [NONE] * (table.n_stacks + 1)  # the trailing slot answers parent -1
        for s, (f, p) in enumerate(zip(table.frame.tolist(), table.parent.tolist(), strict=True)):
            slut[s] = self.stack_id(flut[f], slut[p])
        return np.asarray(slut, dtype=np.int32)

    def table(self) -> StackTable:
        return StackTable.build(self.file, self.line, self.function, self.kind, self.frame, self.parent)


def merge(tables: Sequence[StackTable]) -> tuple[StackTable, list[np.ndarray]]:
    """One table holding every stack of ``tables`` and, per table, the lut of ``StackInterner.add``.
    Tables that are one object (batches of one trace) are merged once; a lone table is kept as is."""
    if tables and all(t is tables[0] for t in tables):
        ident = np.append(np.arange(tables[0].n_stacks, dtype=np.int32), np.int32(NONE))
        return tables[0], [ident] * len(tables)
    interner = StackInterner()
    seen: dict[int, np.ndarray] = {}
    luts = []
    for t in tables:
        if id(t) not in seen:
            seen[id(t)] = interner.add(t)
        luts.append(seen[id(t)])
    return interner.table(), luts


def trim_outer(table: StackTable, drop: np.ndarray) -> tuple[StackTable, np.ndarray]:
    """``table`` without the outermost frames marked in ``drop`` (bool per frame): each stack loses
    the run of dropped frames it starts with (the launcher's frames above a recorded program:
    ``runpy``, the command line's), so equal programs' stacks join at the program's first frame.
    A stack made of dropped frames only becomes none. Returns the new table and the int32 ``lut``
    of ``StackInterner.add`` (``lut[ids]`` remaps an id column; ``lut[-1] == -1``)."""
    interner = StackInterner()
    lut = [NONE] * (table.n_stacks + 1)
    outer_only = [False] * table.n_stacks  # the stack and all its parents are dropped frames
    for s, (f, par) in enumerate(zip(table.frame.tolist(), table.parent.tolist(), strict=True)):
        outer = bool(drop[f]) and (par < 0 or outer_only[par])
        outer_only[s] = outer
        if not outer:
            g = interner.frame_id(table.file[f], int(table.line[f]), table.function[f], int(table.kind[f]))
            lut[s] = interner.stack_id(g, lut[par] if par >= 0 else NONE)
    return interner.table(), np.asarray(lut, dtype=np.int32)


# Bounds on a table read from a file (``from_json``): the JSON itself is at most MAX_JSON_BYTES
# (tracekit.inputs) and lives in the file's footer, so its size is bounded by the file's; these bound
# what it may unfold into (a frame's strings as a call-site's, all of them as all call-sites').
MAX_FRAME_TEXT_BYTES = 16 << 10
CUT_MARK = "…[cut "  # a name the recorder shortened to the bound ends "…[cut N bytes]"


def cut_text(text: str, limit: int = MAX_FRAME_TEXT_BYTES) -> str:
    """``text`` if its UTF-8 (surrogates passed) is at most ``limit`` bytes, else its head with
    ``…[cut N bytes]`` appended, N the bytes left out, all within ``limit`` bytes: what the recorder
    writes of a file or function name (generated code can have a 100 kB one) so every reader takes it."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    keep = limit - 40  # room for the mark
    head = raw[:keep].decode("utf-8", "ignore")  # a character cut in two is dropped whole
    gone = len(raw) - len(head.encode("utf-8", "surrogatepass"))
    return f"{head}{CUT_MARK}{gone} bytes]"
MAX_TABLE_TEXT_BYTES = 32 << 20
MAX_ENTRIES = 1 << 22  # frames, and stacks, each: 4 million


def from_json(obj: object) -> StackTable:
    """A table from the parsed ``tracekit.stacks`` value (``StacksJSON``), every field checked;
    raises ValueError with one clause naming what is wrong (the reader adds the file)."""
    if not isinstance(obj, dict):
        raise ValueError("it is not a JSON object")
    frames, stacks = _part(obj, "frames"), _part(obj, "stacks")
    file = _texts(frames, "frames", "file")
    function = _texts(frames, "frames", "function")
    sizes = [len(s.encode("utf-8", "surrogatepass")) for s in (*file, *function)]
    if max(sizes, default=0) > MAX_FRAME_TEXT_BYTES:
        raise ValueError(f"a frame's file or function is {max(sizes):,} bytes, more than "
                         f"{MAX_FRAME_TEXT_BYTES:,}")
    if (text := sum(sizes)) > MAX_TABLE_TEXT_BYTES:
        raise ValueError(f"its frames hold {text:,} bytes of text, more than {MAX_TABLE_TEXT_BYTES:,}")
    line = _ints(frames, "frames", "line", -1, MAX_LINE)
    kind = _ints(frames, "frames", "kind", 0, int(max(FrameKind)))
    frame = _ints(stacks, "stacks", "frame", 0, MAX_ENTRIES)
    parent = _ints(stacks, "stacks", "parent", NONE, MAX_ENTRIES)
    return StackTable.build(file, line, function, kind, frame, parent)  # its check: lengths, ids, parents


def _part(obj: dict[object, object], key: str) -> dict[object, object]:
    v = obj.get(key)
    if not isinstance(v, dict):
        raise ValueError(f"'{key}' is not a JSON object")
    return v


def _list(part: dict[object, object], where: str, key: str) -> list[object]:
    v = part.get(key)
    if not isinstance(v, list):
        raise ValueError(f"'{where}.{key}' is not a list")
    if len(v) > MAX_ENTRIES:
        raise ValueError(f"'{where}.{key}' has {len(v):,} entries, more than {MAX_ENTRIES:,}")
    return v


def _texts(part: dict[object, object], where: str, key: str) -> list[str]:
    v = _list(part, where, key)
    if not all(type(s) is str for s in v):
        raise ValueError(f"'{where}.{key}' holds a value that is not a string")
    return cast(list[str], v)  # every item checked above


def _ints(part: dict[object, object], where: str, key: str, lo: int, hi: int) -> list[int]:
    v = _list(part, where, key)
    if not all(type(x) is int for x in v):
        raise ValueError(f"'{where}.{key}' holds a value that is not a whole number")
    ints = cast(list[int], v)  # every item checked above
    if ints and not (lo <= min(ints) and max(ints) <= hi):
        raise ValueError(f"'{where}.{key}' holds a value outside {lo} .. {hi}")
    return ints
