"""``tracekit budget``: where the GPU's memory goes before the first allocation, term by term."""

from __future__ import annotations

import typer


def budget(
    device: int = typer.Option(0, "--device", "-d", help="CUDA device ordinal."),
    json_out: bool = typer.Option(False, "--json", help="Print the measurements and terms as JSON."),
    kernel_local_bytes: int | None = typer.Option(
        None, "--kernel-local-bytes", help="Also launch a kernel with N bytes of local memory per thread "
        "and measure what it takes and keeps.", show_default=False),
    probe_largest: bool = typer.Option(
        False, "--probe-largest", help="Also find the largest single allocation (bisection to 2 MiB) "
        "and the allocation granularity."),
) -> None:
    """Measure the budget equation: total = reservations + contexts + local memory + heaps + yours + free."""
    from tracekit.budget.report import budget_report

    typer.echo(budget_report(device, kernel_local_bytes, probe_largest, json_out))


def register(app: typer.Typer) -> None:
    app.command("budget")(budget)
