"""``fits``, ``verdict``, ``headroom_bytes``, the table, the recommendation and the report page's
table agree on committed traces: one function decides (``tracekit.advise.verdict.decide``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.advise.verdict import verdict_rows
from tracekit.cli.app import app

TRACES = Path(__file__).resolve().parents[2] / "traces"
CASES = ["torch-handled-oom", "torch-resnet-fraction", "torch-gpt2-lengths", "cupy-oom-frag"]


@pytest.fixture(scope="module", params=CASES)
def advised(request: pytest.FixtureRequest) -> tuple[str, dict, str]:
    path = str(TRACES / f"{request.param}.parquet")
    j = CliRunner().invoke(app, ["advise", path, "--json", "--jobs", "1"])
    t = CliRunner().invoke(app, ["advise", path, "--jobs", "1"])
    assert j.exit_code == 0 and t.exit_code == 0, (j.output, t.output)
    return request.param, json.loads(j.output), t.output


def test_fits_means_headroom_above_the_margin(advised: tuple[str, dict, str]) -> None:
    _, d, _ = advised
    for r in d["tried"]:
        assert r["fits"] == (r["verdict"] == "fits")
        if r["fits"] and r["headroom_bytes"] is not None:
            assert r["headroom_bytes"] > max(r["margin_bytes"], 0)
        if r["verdict"] == "borderline":
            assert r["gets_through"] and 0 <= r["headroom_bytes"] <= r["margin_bytes"]
        if r["gets_through"] and r["headroom_bytes"] is not None and r["headroom_bytes"] < 0:
            assert r["verdict"] == "no"
    assert all(r["verdict"] == "fits" for r in d["fits"])
    assert all(r["verdict"] == "borderline" for r in d["borderline"])


def test_the_table_and_the_recommendation_say_the_verdict(advised: tuple[str, dict, str]) -> None:
    _, d, text = advised
    rows = {line.split("  ")[0].rstrip(" *"): line for line in text.splitlines()}
    for r, word in verdict_rows(d):
        line = rows[r["setting"]]
        assert f"  {word}  " in line, (r["setting"], line)
    rec = d["recommendation"]
    if d["fits"]:
        assert rec.startswith(d["fits"][0]["setting"]) and " fits " in rec
    else:
        assert " fits under" not in rec.split(";")[0] or rec.startswith("Nothing tried fits")
        if d["borderline"]:
            assert "borderline: " + d["borderline"][0]["setting"] in rec


def test_resnet_with_cudnn_fallbacks_says_nothing_fits() -> None:
    # The real runs under every setting failed (docs/fidelity.md): no setting may be called a fit.
    d = json.loads(CliRunner().invoke(app, ["advise", str(TRACES / "torch-handled-oom.parquet"), "--json",
                                            "--jobs", "1"]).output)
    assert d["fits"] == [] and d["margin"]["workload"] == "reactive"
    expandable = next(r for r in d["tried"] if r["setting"] == "expandable_segments:True")
    assert expandable["headroom_bytes"] < 0 and expandable["verdict"] == "no" and not expandable["fits"]
