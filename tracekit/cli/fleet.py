"""``tracekit fleet PATH...``: many traces at once, one row each and a summary across them (local or Ray)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from tracekit.cli.quick_exit import skip_teardown


def fleet(
    paths: list[str] = typer.Argument(
        ..., metavar="PATH", help="Trace files, folders of traces (*.parquet) or globs."
    ),
    engine: str = typer.Option("local", "--engine", help="local (worker processes) or ray (Ray tasks)."),
    address: str | None = typer.Option(
        None, "--address", help="A running Ray cluster to use (with --engine ray); default: start Ray here."
    ),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="Workers (default: CPUs)."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the table (one row per trace) as Parquet."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the rows and the summary as JSON."),
    report: Path | None = typer.Option(None, "--report", help="Write an HTML report over the fleet."),
    whatif: bool = typer.Option(
        False, "--whatif", help="Add each trace's smallest capacity per allocator (slower)."
    ),
    advise: bool = typer.Option(False, "--advise", help="Add each trace's recommendation."),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
    user_code: list[str] = typer.Option(
        [], "--user-code", metavar="PATH",
        help="Your code, where call-sites are named: frames under PATH (repeatable; docs/analysis.md)."),
) -> None:
    """Analyze many traces (the ranks of one job, runs of a CI history): who ran out of memory and why."""
    if engine == "local":  # no Ray session: tracekit's own code only (quick_exit)
        skip_teardown()
    from tracekit.cli.common import echo_json, say, terminal_progress, wrote
    from tracekit.errors import UsageError
    from tracekit.fleet import Engine, FleetOptions, run_fleet
    from tracekit.trace.stacks import UserCode

    try:
        eng = Engine(engine)
    except ValueError:
        raise UsageError(f"--engine {engine!r}: choose local or ray") from None
    options = FleetOptions(engine=eng, jobs=jobs, address=address, whatif=whatif, advise=advise,
                           output=output, report=report, force=force, user_code=UserCode.of(user_code))
    with terminal_progress("fleet"):  # traces done of all, on a terminal, like every verb
        result = run_fleet(paths, options)
    if user_code:
        _note_unmatched(result.table, user_code)
    if json_out:
        from tracekit.fleet.table import json_rows

        echo_json({"rows": json_rows(result.table), "summary": result.summary.to_dict()})
    else:
        from tracekit.fleet.table import rows_text

        say(rows_text(result.table))
        say("")
        say(result.summary.to_text())
    for path in result.written:
        wrote(path)
    errors = result.summary.errors
    if errors:  # every row and output is out; the exit code still says that some input was bad
        from tracekit.errors import InputError

        raise InputError(f"{len(errors)} of {result.summary.traces} traces could not be analyzed, "
                         f"their rows say why; the first: {errors[0][1]}")


def _note_unmatched(table: Any, user_code: list[str]) -> None:
    """``analyze``'s note per trace of the fleet ``table`` read without error and PATH no frame
    of it lies under (each trace's frames read again here: the members return rows, not frame
    tables)."""
    from tracekit.cli.analyze import note_unmatched
    from tracekit.trace import read_trace
    from tracekit.trace.callsite import stack_table, unmatched
    from tracekit.trace.stacks import UserCode

    code = UserCode.of(user_code)
    for row in table.select("path", "error").iter_rows(named=True):
        if row["error"] is None:
            path = row["path"]
            note_unmatched(path, user_code, unmatched(stack_table(read_trace(path).events), code))


def register(app: typer.Typer) -> None:
    app.command("fleet")(fleet)
