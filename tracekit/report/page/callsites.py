"""Call stacks for the page: the trace's frame table and stack table, as the page's JSON.

The one model of whole call stacks is ``tracekit.trace.stacks.StackTable``: frame ``f`` is
(file, line, function, kind), stack ``s`` is frame ``frame[s]`` called from stack
``parent[s]`` (-1: outermost; ``parent[s] < s``). Every event names one stack id (-1 none).
A trace of format 1 or 2 carries one frame per event; its sites read as one-frame stacks whose
ids are the site ids (``StackTable.from_sites``), so the page has one model for every trace.
Each frame also says whether it is the user's code, as every call-site label of the analyzer
decides it (``tracekit.trace.callsite.FrameRoles``): by default the frames of kind USER that are
neither an array library's (CuPy, PyTorch: also from a source checkout or a stand-in outside
site-packages) nor tracekit's, never C/C++; with ``--user-code PATH`` the frames under PATH.
Each stack also carries its call-site as every verb names it (``tracekit.trace.callsite.CallSites``:
the user's innermost frame U, the request frame R and the label "U in f → R"); stacks of one label
are one call-site, ranked and coloured together by bytes x lifetime (``report.blocks.rank_sites``).
"""

from __future__ import annotations

import numpy as np

from tracekit.report.page.model import Frames, Stacks
from tracekit.report.page.text import safe_texts
from tracekit.trace import Events
from tracekit.trace.callsite import CallSites
from tracekit.trace.stacks import FrameKind, StackTable

# Colour-blind-safe qualitative palette (Okabe-Ito, then Tableau's extras); grey means "other".
PALETTE: tuple[str, ...] = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#d55e00",
    "#cc79a7",
    "#56b4e9",
    "#f0e442",
    "#8c564b",
    "#9467bd",
    "#bcbd22",
    "#17becf",
    "#7f3c8d",
)

KIND_NAMES: list[str] = [k.name.lower() for k in FrameKind]  # index = FrameKind value


def stacks_of(events: Events) -> tuple[StackTable, np.ndarray]:
    """The trace's stack table and the stack id of every event (int32, -1 none): ``events.stacks`` and
    ``events.stack`` (a format-1/2 trace's sites as one-frame stacks, ids = site ids)."""
    return events.stacks, events.stack


def page_stacks(cs: CallSites) -> tuple[Frames, Stacks]:
    """The FRAME and STACK tables of the page's model, with each stack's call-site as the analyzer
    names it (``CallSites``: its user frame, its request frame, its label id into ``labels``)."""
    table = cs.table
    frames = Frames(
        file=safe_texts(table.file),  # escaped once here: the page shows them as they are
        line=table.line.tolist(),
        function=safe_texts(table.function),
        kind=table.kind.tolist(),
        user=cs.roles.user.tolist(),
        kinds=KIND_NAMES,
    )
    stacks = Stacks(
        frame=table.frame.tolist(),
        parent=table.parent.tolist(),
        user_frame=cs.user.tolist(),
        request_frame=cs.request.tolist(),
        label=cs.label.tolist(),
        labels=safe_texts(cs.labels),
    )
    return frames, stacks
