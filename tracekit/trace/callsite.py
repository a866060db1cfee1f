"""The user's own line and the library line that made the request, per stack.

For every stack of a ``StackTable`` (``tracekit.trace.stacks``), once per distinct stack and
with NumPy over the stack table (never per event):

- the **user frame** ``U``: the innermost frame that is the user's code (``UserCode``: by
  default every ``USER`` frame, as ``tracekit.trace.stacks.frame_kind`` decides it: never an
  installed package, a virtualenv, the standard library nor an array library; with
  ``--user-code PATH``, exactly the frames under PATH), never a C/C++ (``NATIVE``) frame and
  never tracekit's own;
- the **request frame** ``R``: the innermost frame that is neither tracekit's, nor C/C++, nor
  the array library's own (PyTorch's ``torch``, CuPy's ``cupy``, ``cupyx``,
  ``cupy_backends``, ``fastrlock``); where the stack has no such frame, its innermost frame
  that is not tracekit's. ``R`` is at or inside ``U`` (an ``R`` outside ``U`` is taken as
  ``U``).

Why not the stack's innermost frame, nor the outermost library frame below the user's line:
the innermost frames of a PyTorch stack are the allocator's C++ and ``torch.nn`` internals
(``_conv_forward``), and the outermost library frame under the user's ``model(x)`` is
always PyTorch's ``Module._call_impl`` dispatch; neither says which line of which model
asked. The innermost frame outside the array library does
(``torchvision/models/resnet.py:151``), and it is the frame the recorder and the importer
have always stored as the one call-site (``site``) of a trace of format 1 or 2, so the
request side of a label names the same line a one-frame trace names.

The **label** of a stack is ``"U.file:U.line in U.function → R.file:R.line"``
(``train.py:88 in step → torchvision/models/resnet.py:151``) when both frames exist and
differ, else the one frame there is as ``path:line:function`` (``Frame.label``): a one-frame
stack (formats 1 and 2, ``StackTable.from_sites``) keeps its call-site's wording exactly.
Stacks with equal (U, R) share one label id, so "at the same call-site" means the same
user line reaching the same request line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from numba import njit

from tracekit.trace.events import Events
from tracekit.trace.stacks import ALLOCATORS, INSTALLED, NONE, Frame, FrameKind, StackTable, UserCode

ARROW = " → "
# Top-level packages of the array libraries that allocate: their frames are the allocator's
# machinery, not the request (``stacks.ALLOCATORS``; ``stacks.LIBRARY_PACKAGES``, wider, are never the
# user's code).
FRAMEWORKS = ALLOCATORS
_TRACEKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../tracekit
_PACKAGES = FRAMEWORKS | {"tracekit"}
STACK_INNER = 64  # frames a shown stack keeps from its inner end (where the request was made)
STACK_OUTER = 4  # and from its outer end (the program's entry)


def stack_ids(ev: Events) -> np.ndarray:
    """Each event's stack id (int32, -1 none) into ``stack_table(ev)``."""
    return ev.stack


def stack_table(ev: Events) -> StackTable:
    """The stack table of ``ev`` (shared by the events cut from it: ``take``, a device's part)."""
    return ev.stacks


def top_package(path: str) -> str:
    """The top-level package a frame's file belongs to: the first folder after the last
    ``site-packages``/``dist-packages``; tracekit's own install folder: ``tracekit``; else
    the outermost folder of the path named like an array library or tracekit (a source
    checkout on ``PYTHONPATH``: ``/src/cupy/cupy/cuda/memory.py`` is ``cupy``'s), else, of a
    relative path, its first folder; "" otherwise."""
    parts = path.replace("\\", "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in INSTALLED:
            return parts[i + 1] if i + 1 < len(parts) - 1 else ""
    if path == _TRACEKIT_DIR or path.startswith(_TRACEKIT_DIR + os.sep):
        return "tracekit"
    named = next((p for p in parts[:-1] if p in _PACKAGES), None)
    if named is not None:
        return named
    return parts[0] if len(parts) > 1 and not os.path.isabs(path) else ""


def nearest(parent: np.ndarray, hit: np.ndarray) -> np.ndarray:
    """Per stack, the nearest stack at or outside it (itself, its parent, …) with ``hit``, -1 none.

    Pointer jumping: ``jump[s]`` = s where hit, else parent[s]; ``jump = jump[jump]`` until
    nothing moves, ⌈log2(depth)⌉ + 1 vector steps.
    """
    ns = len(parent)
    end = ns  # index ns stands for "none" and points at itself
    jump = np.where(hit, np.arange(ns), parent).astype(np.int64)
    jump = np.append(np.where(jump < 0, end, jump), end)
    while True:
        nxt = jump[jump]
        if np.array_equal(nxt, jump):
            break
        jump = nxt
    out = jump[:ns]
    return np.where(out == end, NONE, out).astype(np.int32)


@dataclass(frozen=True, eq=False)
class FrameRoles:
    """Per frame (bool arrays over the frame table): the user's code, tracekit's own, an
    array library's (see ``FRAMEWORKS``), C/C++."""

    user: np.ndarray
    tracekit: np.ndarray
    framework: np.ndarray
    native: np.ndarray

    @classmethod
    def of(cls, table: StackTable, user_code: UserCode) -> FrameRoles:
        pkg = [top_package(f) for f in table.file]  # once per distinct frame
        tracekit = np.array([p == "tracekit" for p in pkg], dtype=bool)
        framework = np.array([p in FRAMEWORKS for p in pkg], dtype=bool)
        native = table.kind == FrameKind.NATIVE
        # The kinds decide (stacks.frame_kind, applied by the reader); an array library's frame a table
        # built in memory calls USER is still not the user's code, unless PATH says so.
        user = user_code.mask(table) & ~native & ~tracekit
        if not user_code.prefixes:
            user &= ~framework
        return cls(user, tracekit, framework, native)


@dataclass(frozen=True, eq=False)
class CallSites:
    """Per stack: the user frame, the request frame and the label id (see the module docstring).

    ``user``/``request``: int32 frame ids per stack (-1 none); ``user_stack``/``request_stack``:
    the stack whose innermost frame that is; ``label``: int32 per stack into ``labels`` (-1: no
    frame to name); ``label_user``/``label_request``: per label, its U and R as
    ``path:line:function`` (None where absent).
    """

    table: StackTable
    roles: FrameRoles
    user: np.ndarray
    request: np.ndarray
    user_stack: np.ndarray
    request_stack: np.ndarray
    label: np.ndarray
    labels: tuple[str, ...]
    label_user: tuple[str | None, ...]
    label_request: tuple[str | None, ...]

    @classmethod
    def of(cls, table: StackTable, user_code: UserCode = UserCode()) -> CallSites:
        roles = FrameRoles.of(table, user_code)
        fr, parent = table.frame, table.parent
        u_st = nearest(parent, roles.user[fr])
        outside = ~(roles.tracekit | roles.native | roles.framework)
        r_st = nearest(parent, outside[fr])
        fallback = nearest(parent, ~roles.tracekit[fr])
        r_st = np.where(r_st >= 0, r_st, fallback)
        # R is at or inside U: ids grow inwards along a path, so R < U means R is outside U.
        r_st = np.where((u_st >= 0) & (r_st >= 0) & (r_st < u_st), u_st, r_st).astype(np.int32)
        ext = np.append(fr, NONE).astype(np.int32)
        u, r = ext[u_st], ext[r_st]  # index -1 picks the trailing NONE
        label, labels, lu, lr = _labels(table, u, r)
        return cls(table, roles, u, r, u_st, r_st, label, labels, lu, lr)

    @cached_property
    def _label_or_none(self) -> np.ndarray:
        return np.append(self.label, NONE).astype(np.int32)  # index -1 picks the trailing NONE

    def of_events(self, stack: np.ndarray) -> np.ndarray:
        """The label id of each given stack id (int32, -1 for stack -1 or no frame)."""
        return self._label_or_none[stack]

    def name(self, label: int) -> str | None:
        return self.labels[label] if label >= 0 else None

    def user_site(self, label: int) -> str | None:
        return self.label_user[label] if label >= 0 else None

    def request_site(self, label: int) -> str | None:
        return self.label_request[label] if label >= 0 else None

    def frames(self, stack: int) -> list[Frame]:
        """The stack's frames, innermost first, tracekit's left out."""
        return [self.table.frame_at(f) for f in self.table.walk(stack) if not self.roles.tracekit[f]]

    def ends(self, stack: int, inner: int = STACK_INNER, outer: int = STACK_OUTER) -> StackEnds:
        """The stack's frames as ``frames`` does, capped: the innermost ``inner`` and the outermost
        ``outer``, and how many lie between them; O(depth) compiled steps, ``inner + outer``
        Frame objects, whatever the depth."""
        ids = self.table.frame[_chain(self.table.parent, stack)] if stack >= 0 else np.zeros(0, np.int32)
        ids = ids[~self.roles.tracekit[ids]]
        n = len(ids)
        left_out = max(n - inner - outer, 0)
        head = ids[:inner] if left_out else ids
        tail = ids[n - outer:] if left_out and outer > 0 else ids[:0]
        return StackEnds(tuple(self.table.frame_at(int(f)) for f in head),
                         tuple(self.table.frame_at(int(f)) for f in tail), left_out)

    def request_side(self, stack: int) -> list[Frame]:
        """The request frame and every frame inside it (what handled the request), innermost first."""
        if stack < 0:
            return []
        stop = int(self.request_stack[stack])
        out: list[Frame] = []
        s = stack
        while s >= 0:
            f = int(self.table.frame[s])
            if not self.roles.tracekit[f]:
                out.append(self.table.frame_at(f))
            if s == stop:
                break
            s = int(self.table.parent[s])
        return out


@dataclass(frozen=True)
class StackEnds:
    """A stack cut to its ends (``CallSites.ends``): ``inner`` innermost first, then ``left_out``
    frames not kept, then ``outer`` (still innermost first, the outermost frame last)."""

    inner: tuple[Frame, ...]
    outer: tuple[Frame, ...]
    left_out: int


@njit(cache=True)
def _chain(parent: np.ndarray, stack: int) -> np.ndarray:  # pragma: no cover - numba
    """The stack ids from ``stack`` out to the outermost (``parent`` until -1), innermost first:
    one pass to count, one to fill."""
    n = 0
    s = stack
    while s >= 0:
        n += 1
        s = parent[s]
    out = np.empty(n, np.int64)
    s = stack
    for i in range(n):
        out[i] = s
        s = parent[s]
    return out


def _labels(table: StackTable, u: np.ndarray, r: np.ndarray
            ) -> tuple[np.ndarray, tuple[str, ...], tuple[str | None, ...], tuple[str | None, ...]]:
    """Label ids per stack and the labels, once per distinct (U, R) pair; pairs that read alike
    (two frames of equal text) share one label."""
    if len(u) == 0:
        return np.zeros(0, np.int32), (), (), ()
    width = table.n_frames + 1  # one int64 key per pair: (u + 1) * width + (r + 1)
    pair = (u.astype(np.int64) + 1) * width + (r.astype(np.int64) + 1)
    keys, inverse = np.unique(pair, return_inverse=True)
    index: dict[str, int] = {}
    users: list[str | None] = []
    requests: list[str | None] = []
    lut = np.full(len(keys), NONE, np.int32)
    for i, (uf, rf) in enumerate(zip((keys // width - 1).tolist(), (keys % width - 1).tolist(), strict=True)):
        user = table.frame_at(uf) if uf >= 0 else None
        req = table.frame_at(rf) if rf >= 0 else None
        text = label_of(user, req)
        if text is None:
            continue
        if text not in index:
            index[text] = len(index)
            users.append(frame_text(user) if user else None)
            requests.append(frame_text(req) if req else None)
        lut[i] = index[text]
    return lut[inverse.reshape(-1)], tuple(index), tuple(users), tuple(requests)


def unmatched(table: StackTable, user_code: UserCode) -> tuple[str, ...]:
    """The prefixes of ``user_code`` (``--user-code``) under which no frame of ``table`` lies:
    once per distinct file name, not per frame or stack."""
    files = set(table.file)
    return tuple(p for p in user_code.prefixes if not any(UserCode((p,)).holds(f) for f in files))


def frame_text(f: Frame) -> str:
    """``path:line:function`` (``Frame.label``); a call-site that did not parse as its own text."""
    return f.file if f.line < 0 and not f.function else f.label()


def label_of(user: Frame | None, request: Frame | None) -> str | None:
    """``U.short() in U.function → R.short()``, or the one frame there is (``frame_text``)."""
    if user is not None and request is not None and request != user:
        where = f"{user.short()} in {user.function}" if user.function else user.short()
        return f"{where}{ARROW}{request.short()}"
    one = user or request
    return frame_text(one) if one is not None else None
