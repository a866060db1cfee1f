"""Reading a trace for analysis and writing the timeline, with the output checks done first.

Output paths are checked before the (possibly large) trace is read, so a
typo or an output that would overwrite the input costs nothing; the timeline
is written through ``tracekit.outputs`` (a temporary file beside the target,
renamed into place), so an interrupted write never leaves half a file under
the user's name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from tracekit.errors import OutputError
from tracekit.outputs import Staged, check_output
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.stacks import UserCode

if TYPE_CHECKING:  # imported where used, once the trace is read (issue 45: the analyzer's kernels)
    from tracekit.analysis.analyze import AnalysisResult
    from tracekit.analysis.tree import TreeLimits


def analyze_file(
    path: str | os.PathLike[str], *, timeline: bool, strict: bool = False,
    outputs: Iterable[tuple[Path | None, str]] = (), force: bool = False,
    user_code: UserCode = UserCode(), trees: TreeLimits | None = None,
) -> AnalysisResult:
    """Check ``outputs`` (path, the option that named it) against ``path``, read the trace, analyze it.

    An existing output is refused unless ``force``; ``user_code`` and ``trees`` as ``analyze_trace``.
    """
    return read_and_analyze(path, timeline=timeline, strict=strict, outputs=outputs, force=force,
                            user_code=user_code, trees=trees)[1]


def read_and_analyze(
    path: str | os.PathLike[str], *, timeline: bool, strict: bool = False,
    outputs: Iterable[tuple[Path | None, str]] = (), force: bool = False,
    user_code: UserCode = UserCode(), trees: TreeLimits | None = None,
) -> tuple[Trace, AnalysisResult]:
    """``analyze_file``, and the trace it read (for a report built from the same reading)."""
    src = Path(path)
    named = [(Path(o), opt) for o, opt in outputs if o is not None]
    for out, opt in named:
        check_output(out, (src,), option=opt, force=force)
    wanted = [o for o, _ in named]
    if len(wanted) != len({o.resolve() for o in wanted}):
        raise OutputError(f"{wanted[0]}: the same path is given for two outputs")
    trace = read_trace(src, strict=strict, extras=False)
    from tracekit.analysis.analyze import analyze_trace

    return trace, analyze_trace(trace, timeline=timeline, user_code=user_code, trees=trees)


def write_timeline(result: AnalysisResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result.timeline`` as zstd Parquet, atomically; returns the path."""
    if result.timeline is None:
        raise ValueError("the analysis was run without a timeline")
    out = Path(path)
    with Staged(out) as staged, open(staged.tmp, "wb") as f:  # an OSError (a full disk): one sentence
        # Dictionary encoding does not pay on these numeric columns; trying it costs time. Written
        # through Python's file, which takes any name (Arrow's own cannot encode one not UTF-8).
        pq.write_table(result.timeline, f, compression="zstd", use_dictionary=False, row_group_size=1 << 20)
    return out
