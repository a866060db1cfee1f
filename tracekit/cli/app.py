"""The ``tracekit`` command: one Typer app, one module per verb, one error funnel.

Every verb module in ``VERBS`` exposes ``register(app)``. Verb modules import
only typer at module level so ``tracekit --help`` stays fast; heavy imports
(numba, polars, matplotlib, cupy, torch) happen inside the command bodies.
``TracekitGroup.invoke`` is the single place where library errors become a
one-line message on stderr and an exit code (see ``tracekit.errors``).
"""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer.core import TyperGroup

from tracekit.errors import TracekitError

VERBS = (
    "info", "synth", "replay", "analyze", "whatif", "record", "recover", "budget",
    "importer", "report",
)


class TracekitGroup(TyperGroup):
    """Turns TracekitError (and Ctrl-C) into a message and an exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TracekitError as e:
            typer.echo(f"tracekit: error: {e}", err=True)
            for note in getattr(e, "__notes__", ()):  # e.g. a cleanup that failed as well
                typer.echo(f"tracekit: note: {note}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("tracekit: interrupted", err=True)
            raise typer.Exit(130) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # keep the pipeline order, not alphabetical


app = typer.Typer(
    cls=TracekitGroup,
    name="tracekit",
    help="Record, replay and explain GPU out-of-memory errors.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)



def _version(value: bool) -> None:
    if value:
        from tracekit import __version__

        typer.echo(f"tracekit {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Record, replay and explain GPU out-of-memory errors."""


for _verb in VERBS:
    importlib.import_module(f"tracekit.cli.{_verb}").register(app)


def main() -> None:
    """Console entry point."""
    app(prog_name="tracekit")


if __name__ == "__main__":  # pragma: no cover
    main()
