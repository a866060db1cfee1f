"""The ``tracekit`` command: one Typer app, one module per verb, one error funnel.

Every verb module in ``VERBS`` exposes ``register(app)``. Verb modules import
only typer (and ``tracekit.cli.quick_exit``, the standard library alone) at module
level so ``tracekit --help`` stays fast; heavy imports (numba, polars, matplotlib,
cupy, torch) happen inside the command bodies. ``main`` ends the process without
the interpreter's teardown when the verb marked the run (``quick_exit``).
``TracekitGroup`` is the single place where library errors, usage errors
(click's "No such option" and the like) and signals become a one-line message
on stderr and an exit code (see ``tracekit.errors``): Ctrl-C exits 130 and
SIGTERM 143, after every ``finally`` (temporary files, device memory) ran.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import typer
import typer.core
from typer.core import TyperGroup

from tracekit import interrupts, numpy_setup
from tracekit.cli import startup_handlers_installed
from tracekit.cli.common import say
from tracekit.errors import Interrupted, TracekitError


class _NeverRaised(Exception):
    """Stands in for an exception this click does not have (so its handler never matches)."""


def _click_exception(name: str) -> type[Exception]:
    """Click's exception ``name`` from the click typer runs on: its own vendored copy (``typer.core``
    imports it as ``_click``, typer 0.28) or, in typers that depend on click, the ``click`` package
    itself (typer 0.19-0.27, which have no ``typer.TyperException``). Looked up by attribute, so a
    typer that moves or drops it changes no behaviour here."""
    for module in ("_click", "click"):
        exceptions = getattr(getattr(typer.core, module, None), "exceptions", None)
        found = getattr(exceptions, name, None)
        if isinstance(found, type) and issubclass(found, Exception):
            return found
    return _NeverRaised


NoArgsIsHelpError: Any = _click_exception("NoArgsIsHelpError")  # format_message(), exit_code
UsageOrClickError: Any = _click_exception("ClickException")  # "No such option" and the like; exit_code


VERBS = (
    "info", "synth", "replay", "analyze", "whatif", "advise", "record", "recover", "budget",
    "importer", "report", "export", "fleet",
)


class TracekitGroup(TyperGroup):
    """Turns TracekitError (and Ctrl-C) into a message and an exit code."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except TracekitError as e:
            say(f"tracekit: error: {e}", err=True)
            for note in getattr(e, "__notes__", ()):  # e.g. a cleanup that failed as well
                say(f"tracekit: note: {note}", err=True)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt as e:
            raise typer.Exit(_announce(getattr(e, "exit_code", 130))) from None
        except BrokenPipeError:
            raise typer.Exit(0) from None
        except MemoryError as e:  # anywhere: the machine or a memory limit, not a bad input
            cause = str(e).splitlines()[0] if str(e) else "MemoryError"
            say(f"tracekit: error: ran out of memory ({cause}); a memory limit (ulimit, a container) "
                "or the machine leaves too little for this input", err=True)
            raise typer.Exit(1) from None
        finally:  # this verb's output checks end with it (a verb run again in this process starts afresh)
            from tracekit.outputs import cleanup

            cleanup()

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             windows_expand_args: bool = True, **extra: Any) -> Any:
        """Click's main with usage errors in tracekit's one-line form and SIGTERM as an exception."""
        _SIGNAL.update(said=False, term=False)
        argv = list(args) if args is not None else sys.argv[1:]
        if argv[:1] != ["record"]:  # record settles it only after the program (runner.epilogue)
            from tracekit.kernel_cache import keep_scipy_from_numba, settle

            settle()
            keep_scipy_from_numba()  # the program record runs keeps its numba as it is
        with _sigterm_raises():
            try:
                rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                  standalone_mode=False,
                                  windows_expand_args=windows_expand_args, **extra)
                code = rv if isinstance(rv, int) else 0
                if code == 130:  # click turned a signal during argument parsing into a bare 130
                    code = _announce(143 if _SIGNAL["term"] else 130)
            except NoArgsIsHelpError as e:
                typer.echo(e.format_message(), err=True)
                code = e.exit_code
            except UsageOrClickError as e:
                say(f"tracekit: error: {_one_sentence(e)}", err=True)
                code = e.exit_code
            except typer.Abort:
                code = _announce(130)
            except KeyboardInterrupt as e:  # a signal that arrived outside the verb's own funnel
                code = _announce(getattr(e, "exit_code", 130))
        if standalone_mode:
            sys.exit(code)
        return code

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self.commands)  # keep the pipeline order, not alphabetical


_SIGNAL = {"said": False, "term": False}  # this run: the signal line printed; SIGTERM received


def announced() -> bool:
    """Whether this run printed its signal line already."""
    return bool(_SIGNAL["said"])


def _announce(code: int) -> int:
    """Print the one line for a signal's exit ``code`` (once per run); returns the code."""
    if not _SIGNAL["said"]:
        typer.echo("tracekit: terminated (SIGTERM)" if code == 143 else "tracekit: interrupted", err=True)
        _SIGNAL["said"] = True
    return code


def _one_sentence(e: Any) -> str:
    msg = " ".join(e.format_message().split())
    ctx = getattr(e, "ctx", None)
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    return msg.rstrip(".") + hint


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises Interrupted, so cleanups run as for Ctrl-C (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _stop(signum: int) -> Interrupted:
        _SIGNAL["term"] = True
        return Interrupted(signum)

    sigint = signal.getsignal(signal.SIGINT)
    if startup_handlers_installed():  # from here on Ctrl-C is a KeyboardInterrupt the verbs clean up after
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts.sigterm_raises(_stop):
            yield
    finally:
        signal.signal(signal.SIGINT, sigint)


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


def _no_access_checks(typer_app: typer.Typer) -> None:
    """Turn off typer's own readability check of every path parameter.

    It runs while the command line is parsed, so an input that exists but may not be read became a
    usage error (exit 2, "path is not readable"); each verb's input check says why a file cannot
    be read (``tracekit.inputs``), as one sentence with exit 1, like any other bad input."""
    commands = [c.callback for c in typer_app.registered_commands]
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _no_access_checks(group.typer_instance)
    for callback in commands:
        for param in inspect.signature(callback).parameters.values() if callback else ():
            if hasattr(param.default, "readable"):
                param.default.readable = False


for _verb in VERBS:
    importlib.import_module(f"tracekit.cli.{_verb}").register(app)
_no_access_checks(app)


# Verbs that read traces and run no program of the user's in this process: NumPy loads as they want
# it (``tracekit.numpy_setup``: no linear algebra, arrays written once).
READING_VERBS = frozenset({"info", "synth", "replay", "analyze", "whatif", "advise", "recover", "importer",
                           "report", "export", "fleet"})


def numpy_for(argv: Sequence[str]) -> None:
    """NumPy loaded as the verbs that read traces want it (``tracekit.numpy_setup``) where the verb
    is one of ``READING_VERBS`` and not asking for help; ``record`` leaves NumPy to load as the user's
    program loads it."""
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb in READING_VERBS and "--help" not in argv and "-h" not in argv:
        numpy_setup.load_numpy()


def main() -> None:
    """Console entry point (ends without the interpreter's teardown where the verb allows it)."""
    from tracekit.cli.quick_exit import _STATE, end_now_if_marked

    numpy_for(sys.argv[1:])
    _STATE["console"] = announced  # this module's own, also when run as ``python -m tracekit.cli.app``
    try:
        app(prog_name="tracekit")
    except SystemExit as e:
        end_now_if_marked(e.code)
        if threading.current_thread() is threading.main_thread():
            # The outcome is decided and printed: a signal during interpreter shutdown must not
            # turn it into a death by signal (Python restores the default action there). Only
            # here, where the process ends: an in-process caller (a test's CliRunner) keeps its own.
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)
        raise


if __name__ == "__main__":  # pragma: no cover
    main()
