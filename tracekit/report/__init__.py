"""Reports: the analyzer's findings drawn as figures in one self-contained HTML page.

``write_report(trace_path, output)`` reads a trace, runs the analyzer (unless
a result is passed in), draws the timeline, the memory map, the OOM moment,
the size histogram and the call-sites at the peak (plus a baseline overlay
and a what-if chart when asked) and writes one HTML file with every figure
embedded, optionally each figure as a PNG too. matplotlib is imported only
when a report is built, never when this package is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def write_report(
    trace_path: Path,
    output: Path | None,
    analysis: Any = None,
    *,
    png_dir: Path | None = None,
    baseline: Path | None = None,
    whatif: Any = None,
    force: bool = False,
    advise: bool = False,
) -> Path:
    """Write the report for ``trace_path`` to ``output``; see ``tracekit.report.build.write_report``."""
    from tracekit.report.build import write_report as _write

    return _write(trace_path, output, analysis, png_dir=png_dir, baseline=baseline, whatif=whatif,
                  force=force, advise=advise)


__all__ = ["write_report"]
