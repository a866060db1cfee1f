"""``tracekit info TRACE``: metadata, event counts per op, time span, devices, streams."""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


def info(
    trace: Path = typer.Argument(..., help="A trace (.parquet), format version 1, 2 or 3."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    strict: bool = typer.Option(False, "--strict", help="Inconsistent events are errors."),
) -> None:
    """Describe a trace: metadata, counts per op, time span, devices and streams."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import echo_json, say, terminal_progress
    from tracekit.progress import report
    from tracekit.trace.info import trace_info
    from tracekit.trace.reader import read_trace

    with terminal_progress("reading"):
        events = read_trace(trace, strict=strict)  # the extra columns too: their names, the pools
        report(1, 2)  # reading is most of the work; the counts are the rest
        summary = trace_info(events)
    if json_out:
        echo_json(summary.to_dict())
    else:
        say(summary.to_text())
    for warning in summary.skipped:
        say(f"tracekit: warning: {trace}: skipped {warning}", err=True)


def register(app: typer.Typer) -> None:
    app.command("info")(info)
