"""``tracekit analyze TRACE``: fragmentation over time, the OOM event and why, leaks."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


def analyze(
    trace: Path = typer.Argument(
        ..., help="A trace (.parquet, format 1, 2 or 3): recorded, imported or replayed; each device on its "
                  "own."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    timeline: Path | None = typer.Option(
        None, "--timeline", help="Write the per-event timeline to this Parquet file."
    ),
    report: Path | None = typer.Option(
        None, "--report", help="Also write the HTML report (the page `tracekit report` writes) to this path."
    ),
    strict: bool = typer.Option(False, "--strict", help="Inconsistent events are errors."),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
    user_code: list[str] = typer.Option(
        [], "--user-code", metavar="PATH",
        help="Your code: frames under PATH (repeatable); default: every frame outside installed "
             "packages, the standard library and tracekit."),
    tree: bool = typer.Option(
        False, "--tree", help="Also the live bytes by call stack at the peak, at each OOM and never freed."),
    tree_native: bool = typer.Option(
        False, "--tree-native", help="Show C/C++ frames in --tree (folded into their caller by default)."),
) -> None:
    """Explain a trace: live/reserved memory, fragmentation, every OOM, the fatal one and its cause
    with the device at that moment, leaks."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.analysis.output import read_and_analyze, write_timeline
    from tracekit.cli.common import echo_json, say, terminal_progress, wrote
    from tracekit.trace.stacks import UserCode

    want = timeline is not None or report is not None  # the report draws the timeline
    outputs = ((timeline, "--timeline"), (report, "--report"))
    limits = None
    if tree or tree_native:  # the trees' module (and its kernels) only where trees are asked for
        from tracekit.analysis.tree import TreeLimits

        limits = TreeLimits(native=tree_native)
    with terminal_progress("analyzing"):
        read, result = read_and_analyze(trace, timeline=want, strict=strict, outputs=outputs, force=force,
                              user_code=UserCode.of(user_code), trees=limits)
    note_unmatched(trace, user_code, result.summary.user_code_unmatched)
    if json_out:
        echo_json(result.summary.to_dict())
    else:
        say(result.summary.to_text())
    for warning in result.summary.skipped:
        say(f"tracekit: warning: {trace}: skipped {warning}", err=True)
    if timeline is not None:
        wrote(write_timeline(result, timeline))
    if report is not None:  # the page `tracekit report` writes, from this reading and this analysis
        from tracekit.report.page import write_page

        with terminal_progress("report"):
            path = write_page(trace, report, result, trace=read, force=force, user_code=user_code)
        wrote(path)


def note_unmatched(trace: object, paths: Sequence[str], misses: Sequence[str]) -> None:
    """One line on stderr per ``--user-code`` PATH that no frame of TRACE lies under: ``misses``
    are the prefixes that hold no frame (``tracekit.trace.callsite.unmatched``); such a PATH
    changes nothing, which would otherwise go unseen."""
    from tracekit.cli.common import say
    from tracekit.trace.stacks import UserCode

    for p in paths:
        if misses and set(UserCode.of([p]).prefixes) <= set(misses):
            say(f"tracekit: note: no frame of {trace} lies under {p}", err=True)


def register(app: typer.Typer) -> None:
    app.command("analyze")(analyze)
