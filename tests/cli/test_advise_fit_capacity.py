"""When nothing fits, the capacity ``advise`` names is one at which its own verdict is "fits".

The bisection finds the smallest capacity a setting's replay gets through; there the headroom is near
0, within the margin by which a real run can exceed the replay (2 % of the limit for a program that
reacts to memory: ResNet-50 with cuDNN fallbacks failed for real inside it, ``docs/fidelity.md``).
So ``fit_capacity_bytes`` is raised from it until the same setting fits with the margin, and the
recommendation names that capacity. Checked by asking ``advise`` again with that capacity as the
limit: the named setting must then be called a fit, where at the bisected capacity it is not (for
the reactive trace).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.units import format_size

TRACES = Path(__file__).resolve().parents[2] / "traces"


def _advise(path: Path, *extra: str) -> dict:
    r = CliRunner().invoke(app, ["advise", str(path), "--json", "--jobs", "1", *extra])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _verdict(d: dict, setting: str) -> str:
    return next(r["verdict"] for r in d["tried"] if r["setting"] == setting)


@pytest.mark.parametrize(("name", "reactive"), [("torch-resnet35", True), ("torch-record-oom", False)])
def test_the_named_capacity_fits_when_asked_again(name: str, reactive: bool) -> None:
    path = TRACES / f"{name}.parquet"
    d = _advise(path)
    assert d["fits"] == [] and d["min_capacity_setting"] is not None
    least, fit, setting = d["min_capacity_bytes"], d["fit_capacity_bytes"], d["min_capacity_setting"]
    assert fit is not None and fit > least
    assert "fits with the margin" in d["recommendation"] and f"from {format_size(fit)}" in d["recommendation"]
    at_fit = _advise(path, "--limit", str(fit))
    assert _verdict(at_fit, setting) == "fits"
    at_least = _advise(path, "--limit", str(least))
    assert _verdict(at_least, setting) != "fits"
    if reactive:  # the bisected capacity is inside the 2 % a real run can exceed the replay by
        assert _verdict(at_least, setting) == "borderline"
