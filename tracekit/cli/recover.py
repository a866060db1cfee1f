"""``tracekit recover SPOOL [-o TRACE]``: a trace from a recording that was killed."""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


def recover(
    path: Path = typer.Argument(..., help="The spool (NAME.parquet.spool), or the trace name it was for."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Trace to write (default NAME.parquet)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output trace."),
) -> None:
    """Turn the spool of an unfinished recording into a trace (marked incomplete)."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import say, terminal_progress, wrote
    from tracekit.record.recover import recover as run

    with terminal_progress("recovering"):
        out = run(path, output, force=force)
    wrote(out)
    from tracekit.record.recover import spool_notes
    from tracekit.trace.reader import read_meta

    for note in spool_notes(read_meta(out).extra):  # cut short or written over: what the trace holds
        say(note, err=True)


def register(app: typer.Typer) -> None:
    app.command("recover")(recover)
