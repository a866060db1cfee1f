"""``tracekit advise TRACE``: allocator settings under which the recorded run fits, verified by replay."""

from __future__ import annotations

from pathlib import Path

import typer


def advise(
    trace: Path = typer.Argument(..., help="A trace (.parquet): a CuPy recording, a PyTorch import, or raw."),
    limit: str | None = typer.Option(
        None, "--limit", help="The limit to fit under (default: the recorded pool limit, or the device)."
    ),
    device_total: str | None = typer.Option(
        None, "--device-total", help="The device under the pool (default: unbounded)."
    ),
    jobs: int | None = typer.Option(None, "--jobs", "-j", min=1, help="Worker processes (default: CPUs)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Find settings under which TRACE fits its limit, by replay, and print a paste-ready line."""
    from tracekit.advise.run import advise as run_advise
    from tracekit.cli.common import echo_json
    from tracekit.trace.reader import read_trace
    from tracekit.units import parse_size

    lim = parse_size(limit, "--limit") if limit is not None else None
    total = parse_size(device_total, "--device-total") if device_total is not None else None
    result = run_advise(read_trace(trace), limit=lim, device_total=total, jobs=jobs)
    if json_out:
        echo_json(result.to_dict())
    else:
        typer.echo(result.to_text())


def register(app: typer.Typer) -> None:
    app.command("advise")(advise)
