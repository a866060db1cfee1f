"""``tracekit record [-o TRACE] [--limit SIZE] [--no-sites] [--torch] [-m] SCRIPT|MODULE [ARGS]...``."""

from __future__ import annotations

from pathlib import Path

import typer


def record(
    target: list[str] = typer.Argument(
        None, metavar="SCRIPT [ARGS]...", help="The program and its arguments, as given to python."
    ),
    module: bool = typer.Option(False, "-m", "--module", help="Run a module, like python -m."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Trace to write (default tracekit-<script>-<pid>.parquet)."
    ),
    limit: str | None = typer.Option(
        None, "--limit", help="Set the CuPy pool's limit first, e.g. 256MiB (pool.set_limit)."
    ),
    no_sites: bool = typer.Option(False, "--no-sites", help="Do not record call-sites (less overhead)."),
    torch: bool = typer.Option(False, "--torch", help="Record a PyTorch program (its memory history)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output trace."),
) -> None:
    """Run a CuPy (or, with --torch, PyTorch) program unmodified and record its allocations."""
    from tracekit.cli.common import wrote
    from tracekit.errors import UsageError

    target = list(target or [])
    if torch:
        if limit is not None or no_sites:
            raise UsageError("--limit and --no-sites apply to CuPy recordings, not --torch")
        from tracekit.importers.torch_record import record_torch  # imports torch only when it runs

        path, code = record_torch(target, module=module, output=output, force=force)
    else:
        from tracekit.record import record_cupy
        from tracekit.units import parse_size

        size = parse_size(limit, "--limit") if limit is not None else None
        path, code = record_cupy(target, module=module, output=output, limit=size,
                                 sites=not no_sites, force=force)
    wrote(path)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command(
        "record",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(record)
