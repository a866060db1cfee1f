"""Option errors name the option the user typed; a missing input file is bad input (exit 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_a_bad_limit_names_the_limit_option(tmp_path: Path) -> None:
    script = tmp_path / "p.py"
    script.write_text("pass\n")
    r = CliRunner().invoke(app, ["record", "--limit", "lots", str(script)])
    assert r.exit_code == 2 and "invalid --limit 'lots'" in r.output


def test_an_unknown_compare_sim_policy_names_compare_sim() -> None:
    from tracekit.device.compare import check_policy

    with pytest.raises(UsageError, match=r"unknown policy 'bogus' for --compare-sim; choose one of: .*cupy"):
        check_policy("bogus")
    check_policy("cupy")


def test_a_missing_whatif_json_is_bad_input(tmp_path: Path) -> None:
    trace = ROOT / "traces" / "cupy-fft.parquet"
    r = CliRunner().invoke(app, ["report", str(trace), "-o", str(tmp_path / "r.html"),
                                 "--whatif-json", str(tmp_path / "missing.json")])
    assert r.exit_code == 1, r.output
    assert "missing.json: no such file" in r.output and not (tmp_path / "r.html").exists()
