"""The bound on the frames an export writes per stack, and what that bound left out.

A stack table stores each stack as one frame and a parent, so a trace of a few megabytes can hold a
chain of millions of frames (a deep recursion, or a hostile file). Every format written here lists
each stack's frames in full, so an export writes at most ``MAX_FRAMES`` frames per stack: the
innermost ones (where the memory was asked for), the outer rest left out and counted (``Cut``).
What an export writes is then bounded by its input: ≤ ``MAX_FRAMES`` frames for each distinct stack
the trace's events name, never depth × entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from tracekit.trace.stacks import StackTable

MAX_FRAMES = 1024  # frames written per stack, innermost first (Python's default recursion limit is 1000)


@dataclass(frozen=True)
class Cut:
    """Stacks deeper than ``limit``: how many of the stacks written were cut, Σ frames left out."""

    limit: int = MAX_FRAMES
    stacks: int = 0
    frames: int = 0


@njit(cache=True)
def _depths(parent):  # pragma: no cover - compiled
    """depth[s] = 1 + depth[parent[s]] (1 for an outermost stack); parents come before children."""
    depth = np.empty(parent.shape[0], np.int64)
    for s in range(parent.shape[0]):
        p = parent[s]
        depth[s] = 1 + (depth[p] if p >= 0 else 0)
    return depth


@njit(cache=True)
def _reach(parent, starts, limit):  # pragma: no cover - compiled
    """left[s] > 0 for each stack within ``limit`` frames of a start (walking outwards): the stacks
    whose frames a cut list of a start holds. A stack is walked again only from a start that reaches
    further past it (``left`` grows), so the pass is O(stacks · small), not O(starts · depth)."""
    left = np.zeros(parent.shape[0], np.int64)
    for i in range(starts.shape[0]):
        s = starts[i]
        r = limit
        while s >= 0 and r > 0 and left[s] < r:
            left[s] = r
            s = parent[s]
            r -= 1
    return left


def used_stacks(stack: np.ndarray) -> np.ndarray:
    """The distinct stack ids of an id column (-1, none, left out), int64 ascending."""
    return np.unique(stack[stack >= 0]).astype(np.int64)


def needed(table: StackTable, used: np.ndarray, limit: int = MAX_FRAMES) -> np.ndarray:
    """The stacks (ascending, so parents first) whose frames the cut lists of ``used`` hold."""
    parent = table.parent.astype(np.int64)
    return np.flatnonzero(_reach(parent, used.astype(np.int64), np.int64(limit)) > 0)


def cut_of(table: StackTable, used: np.ndarray, limit: int = MAX_FRAMES) -> Cut:
    """What writing ``used`` (distinct stack ids) with at most ``limit`` frames each leaves out:
    the stacks deeper than ``limit`` and Σ (depth − limit) over them."""
    if not len(used):
        return Cut(limit)
    depth = _depths(table.parent.astype(np.int64))[used]
    over = depth[depth > limit]
    return Cut(limit, len(over), int((over - limit).sum()))
