"""The moments of a trace as a speedscope profile (https://www.speedscope.app, its file format schema).

One file: ``shared.frames`` holds each frame of the trace's stack table that a moment uses, once
(``name`` = the function, else the file; ``file``; ``line`` where known), plus one ``<no call-site>``
frame for blocks recorded without one. A stack is written with its innermost
``tracekit.export.depth.MAX_FRAMES`` frames at most (the root of a cut stack is its last frame kept).
Each moment (``tracekit.export.moments``) is one profile of type ``sampled``, unit ``bytes``: one
sample per distinct stack, its frames outermost (root) first, weighing that stack's bytes;
``startValue`` 0, ``endValue`` = Σ weights, so speedscope's flame graph (left heavy, sandwich) shows
where the moment's bytes were allocated. ``activeProfileIndex`` opens the fatal OOM when there is
one, else the first peak. Handled OOMs beyond the bound are counted in the file's ``name``.
"""

from __future__ import annotations

import json
from itertools import islice
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

import numpy as np

from tracekit.export.depth import MAX_FRAMES, Cut, cut_of
from tracekit.export.moments import Moment, MomentKind, Selection
from tracekit.trace.stacks import StackTable

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"
NO_STACK = "<no call-site>"


class FrameJSON(TypedDict):
    name: str
    file: NotRequired[str]
    line: NotRequired[int]


class SharedJSON(TypedDict):
    frames: list[FrameJSON]


class SampledProfileJSON(TypedDict):
    type: Literal["sampled"]
    name: str
    unit: Literal["bytes"]
    startValue: int
    endValue: int
    samples: list[list[int]]
    weights: list[int]


class FileJSON(TypedDict):
    """The speedscope file (``FileFormat.File`` of its schema, draft-07)."""

    # "$schema" is not an identifier: the functional form names it.
    exporter: str
    name: str
    activeProfileIndex: int
    shared: SharedJSON
    profiles: list[SampledProfileJSON]


class _Frames:
    """Speedscope frame indices for the stack table's frames, assigned on first use."""

    def __init__(self, table: StackTable) -> None:
        self.table = table
        self.index: dict[int, int] = {}  # stack-table frame id -> speedscope frame index
        self.frames: list[FrameJSON] = []
        self.none = -1
        self.samples: dict[int, list[int]] = {}  # stack id -> its sample, walked once for every moment

    def of_stack(self, stack: int) -> list[int]:
        """The speedscope frame indices of ``stack``, root first (``<no call-site>`` for -1): its
        innermost ``MAX_FRAMES`` frames at most, so the root of a cut stack is its last frame kept."""
        if stack < 0:
            if self.none < 0:
                self.none = self._add(FrameJSON(name=NO_STACK))
            return [self.none]
        ids = self.samples.get(stack)
        if ids is None:
            ids = [self._frame(f) for f in islice(self.table.walk(stack), MAX_FRAMES)]
            ids.reverse()  # walk goes innermost first; a speedscope sample starts at the root
            self.samples[stack] = ids
        return ids

    def _frame(self, f: int) -> int:
        hit = self.index.get(f)
        if hit is None:
            fr = self.table.frame_at(f)
            # The name says where, too: speedscope's Sandwich and left-heavy views list frames by name,
            # and two ``forward``s of different modules must not read alike.
            where = f"{fr.file}:{fr.line}" if fr.line >= 0 else fr.file
            name = f"{fr.function} ({where})" if fr.function and fr.file else (fr.function or fr.file)
            js = FrameJSON(name=name, file=fr.file)
            if fr.line >= 0:
                js["line"] = fr.line
            hit = self.index[f] = self._add(js)
        return hit

    def _add(self, frame: FrameJSON) -> int:
        self.frames.append(frame)
        return len(self.frames) - 1


def profile(m: Moment, frames: _Frames) -> SampledProfileJSON:
    """One moment as a sampled profile in bytes."""
    weights = [int(b) for b in m.bytes.tolist()]
    samples = [frames.of_stack(int(s)) for s in m.stack.tolist()]
    return SampledProfileJSON(type="sampled", name=m.title, unit="bytes", startValue=0,
                              endValue=int(sum(weights)), samples=samples, weights=weights)


def document(sel: Selection, name: str, exporter: str) -> dict[str, object]:
    """The speedscope file of ``sel`` (a JSON object; ``FileJSON`` plus ``$schema``)."""
    frames = _Frames(sel.stacks)
    profiles = [profile(m, frames) for m in sel.moments]
    kinds = [m.kind for m in sel.moments]
    active = kinds.index(MomentKind.FATAL_OOM) if MomentKind.FATAL_OOM in kinds else 0
    if sel.omitted_ooms:
        name += f" ({sel.omitted_ooms} more handled OOMs not exported)"
    body = FileJSON(exporter=exporter, name=name, activeProfileIndex=active,
                    shared=SharedJSON(frames=frames.frames), profiles=profiles)
    return {"$schema": SCHEMA_URL, **body}


def cut(sel: Selection) -> Cut:
    """What ``MAX_FRAMES`` leaves out of the stacks the moments name."""
    named = [m.stack[m.stack >= 0] for m in sel.moments]
    used = np.unique(np.concatenate(named)).astype(np.int64) if named else np.zeros(0, np.int64)
    return cut_of(sel.stacks, used, MAX_FRAMES)


def encode(sel: Selection, source: Path, exporter: str) -> bytes:
    """The file's bytes: compact UTF-8 JSON (text from the trace is escaped by JSON itself)."""
    doc = document(sel, source.name, exporter)
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=True).encode()

