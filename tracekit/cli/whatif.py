"""``tracekit whatif TRACE``: the smallest capacity each simulated allocator needs for a trace."""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


def whatif(
    trace: Path = typer.Argument(..., help="A trace (.parquet, formats 1 to 3); each device on its own."),
    policies: str | None = typer.Option(
        None, "--policies", help="Comma-separated policies (default: the four free-list heaps, buddy, cupy "
        "and torch; cuda, cupy-async and rmm-pool only when named)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    max_capacity: str | None = typer.Option(
        None, "--max-capacity", help="Search no higher than this (e.g. 80GiB); default: unbounded."
    ),
    pool: int | None = typer.Option(
        None, "--pool", metavar="ID",
        help="That pool's events alone (the trace's pool column, as info lists them): each CuPy pool "
        "has its own memory and limit.",
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", min=1,
        help="Threads searching side by side (default: one per CPU; one for short work)."),
) -> None:
    """Find, per allocator policy, the smallest capacity (to 2 MiB) that replays TRACE without OOM."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.advise.capacity import whatif as run_whatif
    from tracekit.cli.common import echo_json, say, terminal_progress
    from tracekit.errors import UsageError
    from tracekit.sim import policies as registry
    from tracekit.trace.reader import read_trace
    from tracekit.units import parse_size

    names = [p.strip() for p in policies.split(",") if p.strip()] if policies is not None else None
    if names is not None and not names:
        raise UsageError("--policies is empty; give names such as best-fit,cupy,torch")
    unknown = [n for n in names or () if n not in registry.names()]
    if unknown:  # reported before the trace is read
        raise UsageError(
            f"unknown policy {unknown[0]!r} in --policies; choose from: {', '.join(registry.names())}"
        )
    cap = parse_size(max_capacity, "--max-capacity") if max_capacity is not None else None
    if cap == 0:  # as replay refuses --capacity 0: no capacity to search below
        raise UsageError("--max-capacity must be positive")
    with terminal_progress("whatif"):
        events = read_trace(trace)
        if pool is not None:
            from tracekit.trace.devices import only_pool

            events = only_pool(events, pool)
        result = run_whatif(events, names, max_capacity=cap, jobs=jobs)
    if json_out:
        echo_json(result.to_dict())
    else:
        say(result.to_text())


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif)
