"""Synthetic whole call stacks: a made-up program's stack table, and a stack id per request.

``program(sites, n, rng)`` builds ``n`` distinct *leaf* stacks (the stacks requests name), spread
evenly over the pattern's call-sites. Each leaf, outermost first: the interpreter's entry
(``<frozen runpy>``, STDLIB), the script's ``<module>`` and ``main`` (USER), then ``depth`` levels:
nine leaves in ten continue an earlier leaf's levels, cut at a random level of their second half,
so callers are shared and callees branch as in a real call tree; new levels are drawn from
per-level pools of frames (level ``l`` offers ``min(4 (l + 1), 48)``, every third level a library
wrapper, ``torch/nn/modules/module.py``); then the site itself (``path:line:function`` parsed into
a USER frame: a stack's innermost user frame is its event's call-site) and one to three library
frames that made the request (``cupy/...``, LIBRARY). ``depth`` is uniform in 8..39.

``assign`` gives each malloc and oom row one of its site's leaves, skewed towards the first ones
(index ``floor(k u^2)``, ``u`` uniform: a few hot paths and a long tail, as in recordings); frees
and rows without a site get -1. Everything is drawn from the ``rng`` passed in, so a seed gives one
trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tracekit.trace.schema import Op
from tracekit.trace.stacks import FrameKind, StackInterner, StackTable, parse_site

DEFAULT_STACKS = 3000  # distinct leaf stacks of a synthetic trace (synth --stacks)
MIN_DEPTH, MAX_DEPTH = 8, 40  # levels between main() and the call-site, [MIN, MAX)

_ENTRY = (("<frozen runpy>", 198, "_run_module_as_main", FrameKind.STDLIB),
          ("<frozen runpy>", 88, "_run_code", FrameKind.STDLIB),
          ("main.py", 120, "<module>", FrameKind.USER),
          ("main.py", 97, "main", FrameKind.USER))
_WRAPPERS = ("torch/nn/modules/module.py", 1747, "Module._call_impl")
_REQUESTS = (("cupy/_creation/basic.py", 31, "empty"), ("cupy/_creation/basic.py", 228, "zeros"),
             ("cupy/_core/_routines_math.py", 88, "_sum"), ("cupy/linalg/_product.py", 62, "matmul"),
             ("cupy/_manipulation/join.py", 60, "concatenate"), ("cupyx/scipy/fft/_fft.py", 330, "fft"))


@dataclass(frozen=True)
class Program:
    """A synthetic stack table and, per call-site, the ids of its leaf stacks (``leaves[s]``)."""

    table: StackTable
    leaves: np.ndarray  # int32 (n_sites, per_site)


def program(sites: Sequence[str], n: int, rng: np.random.Generator) -> Program | None:
    """``n`` leaf stacks over ``sites`` (at least one per site); None when ``n`` is 0 or no sites."""
    if n <= 0 or not sites:
        return None
    per_site = max(1, n // len(sites))
    t = StackInterner()
    entry = -1
    for file, line, function, kind in _ENTRY:
        entry = t.stack_id(t.frame_id(file, line, function, int(kind)), entry)
    leaves = np.empty((len(sites), per_site), np.int32)
    paths: list[list[int]] = []  # the middle levels of the leaves so far (frame ids)
    for s, site in enumerate(sites):
        file, line, function = parse_site(site)
        here = t.frame_id(file, line, function, int(FrameKind.USER))
        for k in range(per_site):
            path = _path(t, paths, rng)
            paths.append(path)
            stack = entry
            for f in path:
                stack = t.stack_id(f, stack)
            stack = t.stack_id(here, stack)
            for _ in range(int(rng.integers(1, 4))):
                rf, rl, rn = _REQUESTS[int(rng.integers(len(_REQUESTS)))]
                stack = t.stack_id(t.frame_id(rf, rl, rn, int(FrameKind.LIBRARY)), stack)
            leaves[s, k] = stack
    return Program(t.table(), leaves)


def _path(t: StackInterner, paths: list[list[int]], rng: np.random.Generator) -> list[int]:
    """The middle levels of a new leaf: mostly an earlier leaf's, cut at a random level in its
    second half and continued afresh (so callers are shared as in a real call tree), else all new."""
    depth = int(rng.integers(MIN_DEPTH, MAX_DEPTH))
    path: list[int] = []
    if paths and rng.random() < 0.9:
        base = paths[int(rng.integers(len(paths)))]
        path = base[:int(rng.integers(len(base) // 2, len(base) + 1))]
    while len(path) < depth:
        path.append(_level_frame(t, len(path), rng))
    return path


def _level_frame(t: StackInterner, level: int, rng: np.random.Generator) -> int:
    """One of level ``level``'s pool of frames: a library wrapper every third level, else user code."""
    if level % 3 == 2:
        file, line, function = _WRAPPERS
        return t.frame_id(file, line, function, int(FrameKind.LIBRARY))
    k = int(rng.integers(min(4 * (level + 1), 48)))
    return t.frame_id(f"model/level{level}.py", 10 + 7 * k, f"Block{k}.forward", int(FrameKind.USER))


def assign(prog: Program, op: np.ndarray, site: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int32 stack id per row: one of its site's leaves for a malloc or oom, else -1."""
    per_site = prog.leaves.shape[1]
    pick = np.floor(per_site * rng.random(len(op)) ** 2).astype(np.int64)
    request = ((op == Op.MALLOC) | (op == Op.OOM)) & (site >= 0) & (site < len(prog.leaves))
    stack = prog.leaves[np.where(request, site, 0), pick]
    return np.where(request, stack, -1).astype(np.int32)
