"""``tracekit export TRACE --format FMT``: a trace in another tool's format (speedscope, PyTorch snapshot)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


class _Format(StrEnum):  # mirrors tracekit.export.run.Format without importing NumPy at --help
    speedscope = "speedscope"
    torch_snapshot = "torch-snapshot"


def export(
    trace: Path = typer.Argument(..., help="A trace (.parquet): recorded, imported, synthetic or replayed."),
    fmt: _Format = typer.Option(
        ..., "--format", "-f",
        help="speedscope: flame graphs of the bytes live at the peak, at each OOM, never freed and "
        "allocated (https://www.speedscope.app). torch-snapshot: the whole history as a PyTorch memory "
        "snapshot pickle (PyTorch's MemoryViz, python -m torch.cuda._memory_viz).",
    ),
    output: Path | None = typer.Option(
        None, "-o", "--output",
        help="File to write (default: TRACE with .speedscope.json or .pickle in place of .parquet).",
    ),
    force: bool = typer.Option(False, "--force", help="Replace an existing output file."),
) -> None:
    """Write a trace in the format of another tool, to open it there."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import say, terminal_progress, wrote
    from tracekit.export.run import Format, export_file
    from tracekit.units import format_size

    with terminal_progress("export"):
        result = export_file(trace, Format(fmt.value), output, force=force)
    for warning in result.skipped:
        say(f"tracekit: warning: {trace}: skipped {warning}", err=True)
    for p in result.shown:
        say(f"{p.title}: {format_size(p.bytes)} in {p.stacks} stack{'s' if p.stacks != 1 else ''}")
    if result.omitted_ooms:
        say(f"tracekit: note: {trace}: {result.omitted_ooms} more handled OOMs are not exported "
            "(the fatal one and the first handled ones are)", err=True)
    if result.cut.stacks:
        c = result.cut
        say(f"tracekit: note: {trace}: {c.stacks} stack{'s' if c.stacks != 1 else ''} deeper than "
            f"{c.limit} frames written as their innermost {c.limit} ({c.frames} outer frames left out)",
            err=True)
    if result.entries:
        say(f"{result.entries} history entries")
    wrote(result.path)


def register(app: typer.Typer) -> None:
    app.command("export")(export)
