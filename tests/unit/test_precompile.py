"""The build's compile step runs real verbs: every one it names exists, and every policy is replayed."""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.app import app
from tracekit.cli.precompile import ROOT, TRACES, _runs
from tracekit.sim import policies


def test_every_step_is_a_verb_and_every_policy_is_replayed(tmp_path: Path) -> None:
    runs = list(_runs(tmp_path, ROOT / "traces"))
    group = typer.main.get_command(app)
    verbs = set(group.commands)  # type: ignore[attr-defined]
    assert {r[0] for r in runs} <= verbs
    assert {"synth", "analyze", "replay", "whatif", "report", "advise", "fleet"} <= {r[0] for r in runs}
    replayed = {r[r.index("--sim") + 1] for r in runs if r[0] == "replay"}
    assert replayed == set(policies.names())


def test_the_committed_traces_come_from_the_folder_given(tmp_path: Path) -> None:
    # A wheel is built from a copy of the package, away from traces/: the build names the folder.
    named = {Path(r[1]).stem for r in _runs(tmp_path, ROOT / "traces") if r[0] == "info"}
    assert set(TRACES) <= named
    elsewhere = {Path(r[1]).stem for r in _runs(tmp_path, tmp_path / "none") if r[0] == "info"}
    assert not set(TRACES) & elsewhere and {"training", "random", "fragmenting"} <= elsewhere
