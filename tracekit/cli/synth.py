"""``tracekit synth``: write a synthetic trace (training, random or fragmenting)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


class _Pattern(StrEnum):  # mirrors tracekit.synth.Pattern without importing NumPy at --help
    training = "training"
    random = "random"
    fragmenting = "fragmenting"


def synth(
    pattern: _Pattern = typer.Option(..., "--pattern", "-p", help="Allocation pattern."),
    events: int = typer.Option(1_000_000, "--events", "-n", help="Number of events."),
    seed: int = typer.Option(0, "--seed", "-s", help="Random seed."),
    output: Path = typer.Option(..., "-o", "--output", help="Output trace (.parquet)."),
    force: bool = typer.Option(False, "--force", help="Replace existing output files."),
    stacks: int = typer.Option(
        3000, "--stacks", metavar="N",
        help="Distinct call stacks the requests carry (0: the call-sites alone, as one-frame stacks).",
    ),
) -> None:
    """Write a synthetic trace: weights+activations, random churn, or splintering."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import terminal_progress, wrote
    from tracekit.synth import Pattern, synthesize

    with terminal_progress("synth"):
        path = synthesize(Pattern(pattern.value), events, seed, output, force=force, stacks=stacks)
    wrote(path)


def register(app: typer.Typer) -> None:
    app.command("synth")(synth)
