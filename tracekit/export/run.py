"""``export_file``: one trace to one file of another tool's format, the output checked before any work.

The output path goes through the one output policy first (``tracekit.outputs.check_output``: its
folder exists, it is not the trace itself, an existing file only with ``force``), then the trace is
read and validated (``tracekit.trace.reader``), and the file is written atomically (a temporary file
renamed into place), so an interrupted export never leaves half a file under the user's name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tracekit import __version__
from tracekit.export.depth import Cut
from tracekit.outputs import atomic_output, check_output, write_bytes
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import Op


class Format(StrEnum):
    """The formats ``tracekit export`` writes."""

    SPEEDSCOPE = "speedscope"
    TORCH_SNAPSHOT = "torch-snapshot"

    @property
    def suffix(self) -> str:
        """The default output's suffix, in place of the trace's ``.parquet``."""
        return ".speedscope.json" if self is Format.SPEEDSCOPE else ".pickle"


@dataclass(frozen=True)
class Shown:
    """One profile of a speedscope export: its title, Σ bytes and how many distinct stacks."""

    title: str
    bytes: int
    stacks: int


CUT_NONE = Cut()  # nothing cut


@dataclass(frozen=True)
class ExportResult:
    """What an export wrote."""

    path: Path
    format: Format
    shown: tuple[Shown, ...] = ()  # speedscope: the profiles
    omitted_ooms: int = 0  # speedscope: handled OOMs beyond the bound
    entries: int = 0  # torch-snapshot: history entries written (a free is two)
    skipped: tuple[str, ...] = ()  # the reader's dropped inconsistent events, described
    cut: Cut = CUT_NONE  # the stacks written cut to their innermost MAX_FRAMES frames


EXPORTER = f"tracekit {__version__}"


def default_output(trace: Path, fmt: Format) -> Path:
    """``TRACE`` with ``.parquet`` replaced by the format's suffix."""
    return trace.with_name(trace.name.removesuffix(".parquet") + fmt.suffix)


def export_file(trace_path: str | os.PathLike[str], fmt: Format, output: str | os.PathLike[str] | None = None,
                *, force: bool = False) -> ExportResult:
    """Export ``trace_path`` as ``fmt`` to ``output`` (default: ``default_output``)."""
    src = Path(trace_path)
    out = check_output(Path(output) if output is not None else default_output(src, fmt), (src,), force=force)
    trace = read_trace(src)
    skipped = tuple(i.describe() for i in trace.issues)
    if fmt is Format.SPEEDSCOPE:
        from tracekit.export import speedscope
        from tracekit.export.moments import select

        sel = select(trace)
        write_bytes(out, speedscope.encode(sel, src, EXPORTER))
        shown = tuple(Shown(m.title, m.total, len(m.stack)) for m in sel.moments)
        return ExportResult(out, fmt, shown=shown, omitted_ooms=sel.omitted_ooms, skipped=skipped,
                            cut=speedscope.cut(sel))
    from tracekit.export.torch_snapshot import write_snapshot

    with atomic_output(out) as f:
        cut = write_snapshot(trace, f, EXPORTER)
    entries = len(trace.events) + trace.events.count(Op.FREE)
    return ExportResult(out, fmt, entries=entries, skipped=skipped, cut=cut)
