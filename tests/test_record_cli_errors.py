"""Option errors name the option the user typed; a missing input file is bad input (exit 1)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from tracekit.cli.app import app

ROOT = Path(__file__).resolve().parent.parent


def test_a_bad_limit_names_the_limit_option(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("pass\n")
    r = CliRunner().invoke(app, ["record", "--limit", "lots", str(script)])
    assert r.exit_code == 2 and "invalid --limit 'lots'" in r.output

