"""The top-level command: no verb prints the help, an unknown verb is one line, both exit 2.

Run through a real process, as a user runs it, so the exit codes are the
ones a shell sees (CliRunner would not go through ``sys.exit``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tracekit(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"})


def test_no_verb_prints_the_help_and_exits_2() -> None:
    res = _tracekit()
    assert res.returncode == 2
    assert "Usage: tracekit [OPTIONS] COMMAND" in res.stdout and "replay" in res.stdout
    assert "Traceback" not in res.stderr and "error" not in res.stderr


def test_an_unknown_verb_is_one_line_and_exits_2() -> None:
    res = _tracekit("nosuchverb")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == "tracekit: error: No such command 'nosuchverb' (see 'tracekit --help')\n"


def test_the_no_arguments_exception_is_the_one_typer_raises() -> None:
    import typer.core

    from tracekit.cli.app import NoArgsIsHelpError

    # typer's own click (vendored or not) defines it; the stand-in would let no-args fall through
    assert NoArgsIsHelpError.__name__ == "NoArgsIsHelpError"
    home = sys.modules[NoArgsIsHelpError.__module__]
    assert home.__name__.endswith("click.exceptions")
    assert any(getattr(getattr(typer.core, m, None), "exceptions", None) is home for m in ("_click", "click"))


def test_the_usage_error_funnel_catches_the_click_typer_raises_from() -> None:
    import typer.core

    from tracekit.cli.app import UsageOrClickError

    # typer 0.28 raises its vendored click's ClickException (typer.TyperException), earlier typers
    # click's own; the funnel names whichever this typer uses, never the stand-in
    assert UsageOrClickError.__name__ == "ClickException"
    home = sys.modules[UsageOrClickError.__module__]
    assert any(getattr(getattr(typer.core, m, None), "exceptions", None) is home for m in ("_click", "click"))
    if hasattr(typer, "TyperException"):  # 0.28: its only subclass, so nothing it raised goes uncaught
        assert typer.TyperException.__subclasses__() == [UsageOrClickError]


def test_an_unknown_option_is_one_line_and_exits_2() -> None:
    res = _tracekit("replay", str(ROOT / "traces" / "cupy-oom-frag.parquet"), "--nope")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("tracekit: error: No such option"), res.stderr
    assert res.stderr.count("\n") == 1, res.stderr


@pytest.mark.parametrize("args", [
    ["report", "{t}", "--advise", "--limit", "0", "-o", "{o}"],  # as advise refuses --limit 0
    ["whatif", "{t}", "--max-capacity", "0"],  # as replay refuses --capacity 0
    ["replay", "{t}", "--sim", "cupy", "--continue-on-oom", "--stop-at-first-oom"],
])
def test_contradictory_or_empty_options_are_usage_errors(tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "p.html"
    r = _tracekit(*[a.format(t=ROOT / "traces" / "cupy-oom-frag.parquet", o=out) for a in args])
    assert r.returncode == 2 and r.stderr.startswith("tracekit: error:"), r.stderr
    assert not out.exists()
