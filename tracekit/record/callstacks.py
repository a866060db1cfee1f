"""Whole call stacks of the recorded program, interned as it runs (trace format v3).

At every malloc and out-of-memory request the hook reads the Python frames of the call, from the
innermost outwards, at most ``depth`` of them: the *window*. The depth counts from the call-site
frame (the innermost frame outside CuPy and tracekit, the ``site`` column's): where the window's
innermost frames are CuPy's and the depth cut it short, ``k`` more frames are read beyond it,
``k`` the number of those frames (``LiveStacks.longer``), so CuPy's frames never use up the depth
and a small ``--stack-depth`` still keeps the user's line. Its key is the ``id`` of each frame's
code object and its instruction offset (``f_lasti``): a tuple of ints, hashed once, looked up in
one dict (``LiveStacks.hot``) that answers the pair (the one-frame site's row bits, the stack
id). Only a window never seen before takes the slow path (``LiveStacks.miss``): each frame is
named once per (code, offset) (path made relative to the first root holding it, as the one-frame
site is, its line, its qualified name, its kind), tracekit's own frames are dropped (and what
called tracekit's launcher: the stack ends at the program's ``<module>``), and the frames are
interned into stacks (``tracekit.trace.stacks.StackInterner``: one frame and one
parent per stack). No frame object is kept beyond the call (that would keep the program's arrays
alive past their frames' end); the code objects seen are kept, so their ids are never reused.

The window is read with C-level iteration (``itertools.accumulate`` of ``getattr(f, "f_back")``
stopped at ``None`` by ``takewhile(bool, ...)``, then ``map`` of the two attribute getters), so
the cost per frame is a few C calls and no bytecode. ``docs/record.md`` has the measured cost.

Kinds: ``tracekit.trace.stacks.frame_kind`` of the frame's absolute path, with the folders the
interpreter names (``environment_now``, the same the trace's ``environment`` metadata stores;
``root_kinds``): the standard library -> ``STDLIB``; site-packages, the array library's package,
a virtualenv inside the program's folder -> ``LIBRARY``, even inside the working directory or the
program's folder; then the more specific of those user's folders and ``sys.prefix``; then names
(a ``site-packages`` folder a program put on ``sys.path`` itself, an array library's package).
CuPy's Python frames stay in the stack (the innermost library frame that made the request is
wanted); the one-frame site still skips them.

The tables grow only (ids are dense and never change), so the spool writes the frames and stacks
new since its last batch, as it does call-site names, and ``tracekit recover`` rebuilds them.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import os
import sys
import threading
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import accumulate, takewhile
from operator import attrgetter
from types import CodeType, FrameType

from tracekit.record.sites import SiteTable, relative_path
from tracekit.trace.schema import Environment
from tracekit.trace.stacks import (
    INSTALLED,
    VENV_MARK,
    VENV_NAMES,
    Folders,
    FrameKind,
    StackInterner,
    cut_text,
    frame_kind,
)

DEFAULT_DEPTH = 64  # frames per stack unless --stack-depth says otherwise
SITE_SHIFT = 32  # where a row's code keeps site + 1 (tracekit.record.hook)
# The stack id ``LiveStacks.hot`` answers for a window that the depth cut short inside CuPy's (or
# tracekit's) frames, with their count in the site slot: the caller reads that many frames more
# (``LiveStacks.longer``) for the real answer.
LONGER = -2

frame_code, frame_lasti = attrgetter("f_code"), attrgetter("f_lasti")


def backs(depth: int) -> tuple[str, ...]:
    """What ``window`` iterates over for a window of ``depth`` frames (made once per recording)."""
    return ("f_back",) * (depth - 1)


def window(frame: FrameType | None, steps: tuple[str, ...],
           stop: Callable[[object], bool] | None = None) -> list[FrameType]:
    """``frame`` and its callers, one per item of ``steps`` (``backs``), fewer where the stack ends:
    ``frame``, ``frame.f_back``, ... up to the first None, all in C; with ``stop`` (``not_at``)
    also up to the launcher's frame, which is left out."""
    if frame is None:
        return []
    frames = accumulate(steps, getattr, initial=frame)
    return list(takewhile(bool, takewhile(stop, frames) if stop is not None else frames))


def not_at(launcher: FrameType) -> Callable[[object], bool]:
    """A C-level predicate, false at ``launcher`` only: ``window`` stops there. The launcher is the
    frame of tracekit's that runs the program (``record_cupy``): alive as long as the program runs,
    so holding it keeps nothing of the program's alive, and every frame outside it is the
    launcher's own (typer, runpy), never part of a stack, so the hot path need not read them."""
    return functools.partial(operator.is_not, launcher)


def window_key(frames: list[FrameType]) -> tuple[int, ...]:
    """The cache key of a window: the code ids, then the instruction offsets."""
    return (*map(id, map(frame_code, frames)), *map(frame_lasti, frames))


class LiveStacks:
    """The frames and stacks of one recording; ``hot`` maps a window key to (site bits, stack id).

    ``site bits`` is ``(site + 1) << 32`` (the row code's site field), or None where the window
    holds no frame outside the site's skipped libraries (the site is then looked up each time,
    beyond the window). The answer is ``(k, LONGER)`` for a window of ``depth`` frames whose ``k``
    innermost ones are the skipped libraries': ``longer`` answers for it from the window and ``k``
    frames beyond (its own cache ``long``), so the depth counts from the call-site frame.
    """

    def __init__(self, sites: SiteTable, depth: int, own_dirs: tuple[str, ...],
                 kinds: tuple[tuple[str, FrameKind], ...], launcher: FrameType | None = None) -> None:
        self.sites, self.depth, self.steps = sites, depth, backs(depth)
        self.stop = not_at(launcher) if launcher is not None else None
        self.launcher = launcher  # where the compiled window walk stops (fastpath.window_hash)
        self._own = tuple(os.path.join(os.path.abspath(d), "") for d in own_dirs)
        self._kinds = kinds
        self.hot: dict[Hashable, tuple[int | None, int]] = {}  # window key or hash -> answer
        self.long: dict[tuple[int, ...], tuple[int | None, int]] = {}  # longer windows (``longer``)
        self._frame_of: dict[tuple[int, int], int] = {}  # (id(code), f_lasti) -> frame id
        self._named: dict[int, tuple[str, str, int] | None] = {}  # id(code) -> (path, name, kind); None: own
        self._codes: list[CodeType] = []  # keeps every code seen alive, so its id stays unique
        self.table = StackInterner()
        self._lock = threading.Lock()

    def capture(self, frame: FrameType | None) -> tuple[int, int]:
        """(site id, stack id) of a request whose innermost Python frame is ``frame``."""
        frames = window(frame, self.steps, self.stop)
        v = self.hot.get(window_key(frames))
        if v is None:
            v = self.miss(frames)
        bits, stack = v
        if stack == LONGER and bits is not None:  # bits: the count of the libraries' frames
            bits, stack = self.longer(frames, bits)
        return ((bits >> SITE_SHIFT) - 1 if bits is not None else self.sites.site_of(frame)), stack

    def miss(self, frames: list[FrameType], key: object = None) -> tuple[int | None, int]:
        """Slow path: name and intern the window's frames, remember the window's answer (``(k, LONGER)``
        for a full window whose ``k`` innermost frames are the skipped libraries': the depth cut it)
        under ``key`` (the compiled walk's hash, ``fastpath.window_hash``) or the window's own key."""
        if key is None:
            key = window_key(frames)
        with self._lock:
            v = self.hot.get(key)  # another thread may have just added it
            if v is None:
                outside = (i for i, f in enumerate(frames) if not self.sites.is_internal(f.f_code))
                k = next(outside, len(frames))  # the skipped libraries' frames inside the call-site
                cut = len(frames) == self.depth and k > 0
                v = self.hot[key] = (k, LONGER) if cut else (self._site_bits(frames), self._stack(frames))
        return v

    def longer(self, frames: list[FrameType], k: int) -> tuple[int | None, int]:
        """(site bits, stack id) of a window answered ``(k, LONGER)``: ``k`` frames more are read beyond
        it (and where every frame of it is the skipped libraries', those beyond up to the call-site
        frame), so the stack holds ``depth`` frames from the call-site outwards (fewer where the stack
        ends) and the libraries' inside it. One more window read and lookup per request: only with a
        ``depth`` below the program's own (measured in ``docs/record.md``)."""
        beyond = frames[-1].f_back
        if k == len(frames):
            k += self._inside_site(beyond)
        full = frames + window(beyond, backs(k), self.stop)
        key = window_key(full)
        v = self.long.get(key)
        if v is None:
            with self._lock:
                v = self.long.get(key)
                if v is None:
                    v = self.long[key] = (self._site_bits(full), self._stack(full))
        return v

    def _inside_site(self, frame: FrameType | None) -> int:
        """How many frames from ``frame`` outwards are the skipped libraries' (CuPy's, tracekit's)
        before the call-site frame (all of them up to the launcher where there is none)."""
        k = 0
        while frame is not None and (self.stop is None or self.stop(frame)) \
                and self.sites.is_internal(frame.f_code):
            k += 1
            frame = frame.f_back
        return k

    def _site_bits(self, frames: list[FrameType]) -> int | None:
        for f in frames:
            if not self.sites.is_internal(f.f_code):
                return (self.sites.site_of(f) + 1) << SITE_SHIFT
        return None

    def _stack(self, frames: list[FrameType]) -> int:
        """The stack id of a window: tracekit's innermost frames (its allocator wrappers) left out,
        and the first tracekit frame met after the program's ends the stack: what lies beyond is
        tracekit's launcher (its runner, the command line's typer and runpy frames), or a thread's
        start-up around tracekit's hook installer, never the program's."""
        ids: list[int] = []
        for fid in map(self._frame_id, frames):
            if fid >= 0:
                ids.append(fid)
            elif ids:
                break
        stack = -1
        for fid in reversed(ids):  # outermost first: a parent is interned before its children
            stack = self.table.stack_id(fid, stack)
        return stack

    def _frame_id(self, frame: FrameType) -> int:
        """The frame id of ``frame`` at its current instruction; -1 for tracekit's own frames."""
        code = frame.f_code
        key = (id(code), frame.f_lasti)
        fid = self._frame_of.get(key)
        if fid is None:
            named = self._name(code)
            fid = -1 if named is None else self.table.frame_id(named[0], _line(frame), named[1],
                                                               named[2])
            self._frame_of[key] = fid
        return fid

    def _name(self, code: CodeType) -> tuple[str, str, int] | None:
        if id(code) not in self._named:
            self._codes.append(code)
            path = code.co_filename
            if self._own and os.path.abspath(path).startswith(self._own):
                self._named[id(code)] = None
            else:
                name = getattr(code, "co_qualname", code.co_name)
                self._named[id(code)] = (cut_text(relative_path(path, self.sites.roots)), cut_text(name),
                                         int(kind_of(path, self._kinds)))
        return self._named[id(code)]

    # -- what the spool writes ------------------------------------------------------------------
    @property
    def n_frames(self) -> int:
        return len(self.table.file)

    @property
    def n_stacks(self) -> int:
        return len(self.table.frame)

    def frames_since(self, start: int) -> list[tuple[str, int, str, int]]:
        """(file, line, function, kind) of frame ids ``start``, ``start+1``, ... known now."""
        with self._lock:
            t = self.table
            return list(zip(t.file[start:], t.line[start:], t.function[start:], t.kind[start:], strict=True))

    def stacks_since(self, start: int) -> list[tuple[int, int]]:
        """(frame, parent) of stack ids ``start``, ``start+1``, ... known now."""
        with self._lock:
            t = self.table
            return list(zip(t.frame[start:], t.parent[start:], strict=True))


def _line(frame: FrameType) -> int:
    line = frame.f_lineno  # None at some instructions (3.12: no line)
    return line if line is not None else -1


CUPY_PACKAGES = ("cupy", "cupyx", "cupy_backends", "fastrlock")  # CuPy's packages (sites.default_skip_dirs)
TORCH_PACKAGES = ("torch", "torchvision", "torchaudio", "triton")  # PyTorch's, where installed


def kind_of(path: str, kinds: Folders) -> FrameKind:
    """The kind of the code at ``path`` (a code object's file name, made absolute): ``frame_kind``
    with the folders of ``root_kinds``."""
    if not path.startswith("<"):
        path = os.path.abspath(path)
    return frame_kind(path, kinds)


def root_kinds(roots: tuple[str, ...], packages: tuple[str, ...] = CUPY_PACKAGES) -> Folders:
    """The folders ``kind_of`` asks, in order (``Environment.folders``): the interpreter's, and the
    user's among ``roots`` (``site_roots``: the working directory, the program's folder)."""
    return environment_now(roots, packages).folders()


def environment_now(roots: Sequence[str], packages: Sequence[str]) -> Environment:
    """What this interpreter says is not the user's code, and which of ``roots`` (``site_roots``) are
    the user's: the one source of the recorder's kinds (``root_kinds``) and of the trace's
    ``environment`` metadata (CuPy's ``start_meta``, ``record --torch``), so the two agree.

    ``packages``: the array library's top-level packages, found without importing them. Every folder
    absolute, and again with symbolic links resolved where that differs (a code object names a file
    as it was imported). A folder the interpreter's helpers cannot name (an embedded interpreter
    without ``site``'s) is left out. A virtualenv inside a user's folder (``.venv``, ``venv`` holding
    ``pyvenv.cfg``) is listed even when another interpreter records: its code is never the user's."""
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    std = _both(paths.get(k) for k in ("stdlib", "platstdlib"))
    libs = _both(paths.get(k) for k in ("purelib", "platlib"))
    with contextlib.suppress(AttributeError):  # site helpers are missing in some embedded interpreters
        libs += _both([*site.getsitepackages(), site.getusersitepackages()])
    libs += _both(p for p in sys.path
                  if isinstance(p, str) and os.path.basename(p.rstrip(os.sep)) in INSTALLED)
    user = [a for a in _both(roots) if a not in libs and a not in std
            and os.path.basename(a) not in INSTALLED]
    venvs = _both(v for r in user for name in sorted(VENV_NAMES)
                  if os.path.isfile(os.path.join(v := os.path.join(r, name), VENV_MARK)))
    return Environment(prefix=os.path.abspath(sys.prefix), base_prefix=os.path.abspath(sys.base_prefix),
                       stdlib=tuple(std), site_packages=tuple(_unique(libs)),
                       libraries=tuple(_both(package_dirs(packages))), tracekit=tuple(_both(tracekit_dirs())),
                       venvs=tuple(venvs), user=tuple(user))


def package_dirs(packages: Sequence[str]) -> list[str]:
    """The folders of the top-level ``packages`` that are installed (found, not imported)."""
    import importlib.util

    out: list[str] = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):  # a broken install, or a module whose __spec__ is None
            continue
        if spec is not None and spec.submodule_search_locations:
            out.extend(spec.submodule_search_locations)
    return out


def _both(folders: Iterable[str | None]) -> list[str]:
    """Each folder absolute and, where it differs, with symbolic links resolved; in order, once."""
    out: list[str] = []
    for f in folders:
        if f:
            out += [os.path.abspath(f), os.path.realpath(f)]
    return _unique(out)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def tracekit_dirs() -> tuple[str, ...]:
    """tracekit's own package folder: the only frames a stack leaves out."""
    return (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),)


def live_stacks(sites: SiteTable, depth: int, launcher: FrameType | None = None) -> LiveStacks | None:
    """The stack tables of a recording whose site table is ``sites``; None for ``depth`` 0.
    ``launcher``: the frame that runs the program, where every window stops (``not_at``)."""
    if depth <= 0:
        return None
    return LiveStacks(sites, depth, tracekit_dirs(), root_kinds(sites.roots), launcher)


Capture = Callable[[FrameType | None], tuple[int, int]]


def capture_of(sites: SiteTable | None, stacks: LiveStacks | None) -> Capture:
    """(site, stack) of a request from its innermost frame: whole stacks, the site alone, or none."""
    if stacks is not None:
        return stacks.capture
    if sites is not None:
        site_of = sites.site_of
        return lambda frame: (site_of(frame), -1)
    return lambda frame: (-1, -1)

