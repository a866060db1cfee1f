"""Reading a trace for analysis and writing the timeline, with the output checks done first.

Output paths are checked before the (possibly large) trace is read, so a
typo or an output that would overwrite the input costs nothing; the timeline
is written to a temporary file beside the target and renamed into place, so
an interrupted write never leaves half a file under the user's name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pyarrow.parquet as pq

from tracekit.analysis.analyze import AnalysisResult, analyze_trace
from tracekit.errors import OutputError
from tracekit.trace.reader import read_trace
from tracekit.trace.writer import check_output_path


def analyze_file(
    path: str | os.PathLike[str], *, timeline: bool, strict: bool = False,
    outputs: Iterable[tuple[Path | None, str]] = (),
) -> AnalysisResult:
    """Check ``outputs`` (path, the option that named it) against ``path``, read the trace, analyze it."""
    src = Path(path)
    named = [(Path(o), opt) for o, opt in outputs if o is not None]
    for out, opt in named:
        check_output_path(out, (src,), option=opt)
    wanted = [o for o, _ in named]
    if len(wanted) != len({o.resolve() for o in wanted}):
        raise OutputError(f"{wanted[0]}: the same path is given for two outputs")
    return analyze_trace(read_trace(src, strict=strict, extras=False), timeline=timeline)


def write_timeline(result: AnalysisResult, path: str | os.PathLike[str]) -> Path:
    """Write ``result.timeline`` as zstd Parquet, atomically; returns the path."""
    if result.timeline is None:
        raise ValueError("the analysis was run without a timeline")
    out = Path(path)
    check_output_path(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        # Dictionary encoding does not pay on these numeric columns; trying it costs time.
        pq.write_table(result.timeline, tmp, compression="zstd", use_dictionary=False,
                       row_group_size=1 << 20)
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"{out}: cannot write the timeline ({e.strerror or e})") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out
