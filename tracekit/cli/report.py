"""``tracekit report TRACE``: the analyzer's findings as one interactive, self-contained HTML page."""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


def report(
    trace: Path = typer.Argument(..., help="A trace (.parquet, formats 1 to 3); each device on its own."),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="HTML file to write (default: TRACE with the suffix .html)."
    ),
    png: Path | None = typer.Option(
        None, "--png", help="Also write each figure as PNG (matplotlib) into this folder."
    ),
    baseline: Path | None = typer.Option(
        None, "--baseline", help="A second trace (e.g. before a fix) to overlay and compare."
    ),
    whatif: bool = typer.Option(
        False, "--whatif", help="Also find the smallest capacity each allocator needs (slower)."
    ),
    whatif_json: Path | None = typer.Option(
        None, "--whatif-json", help="Use saved `tracekit whatif --json` output instead of recomputing."
    ),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
    advise: bool = typer.Option(
        False, "--advise", help="Also add `tracekit advise`: the settings that fit (slower)."
    ),
    limit: str | None = typer.Option(
        None, "--limit", help="With --advise: the limit to fit under (default: as advise chooses it)."),
    user_code: list[str] = typer.Option(
        [], "--user-code", metavar="PATH",
        help="Frames under PATH are your code (repeatable; default: frames outside installed "
        "packages and Python's own library).",
    ),
) -> None:
    """One HTML page the browser draws: timeline, allocator state and flame graph at any event, budget,
    tables."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import say, terminal_progress, wrote
    from tracekit.errors import UsageError
    from tracekit.inputs import check_regular
    from tracekit.report.page import write_page
    from tracekit.units import parse_size

    if limit is not None and not advise:
        raise UsageError("--limit is advise's limit: give it with --advise")
    cap = parse_size(limit, "--limit") if limit is not None else None
    if cap is not None and cap <= 0:  # as advise refuses it
        raise UsageError(f"--limit {limit}: give a positive size (CuPy reads a limit of 0 as no limit)")
    if whatif and whatif_json is not None:
        raise UsageError("--whatif and --whatif-json are exclusive: give one")
    out = output if output is not None else trace.with_suffix(".html")
    if whatif_json is not None:
        check_regular(whatif_json, "what-if JSON")
    what = whatif_json if whatif_json is not None else (True if whatif else None)
    with terminal_progress("report"):
        path = write_page(trace, out, png_dir=png, baseline=baseline, whatif=what, force=force,
                          advise=advise, user_code=user_code, limit=cap,
                          on_note=lambda text: say(f"tracekit: note: {text}", err=True))
    wrote(path)
    if png is not None:
        wrote(png)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
