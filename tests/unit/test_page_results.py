"""The page is built from typed results: the analysis, advise's and the what-if search's result types.

Checked: the builders' signatures name those types (no ``Any``, no dict), nothing in
``tracekit/report/page`` reads a result by string key, the answer block says what advise's own JSON says,
OOMs group by outcome, call-site and handler, the request as PyTorch's message named it, the pool cap
sentence.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

from tracekit.advise.capacity import WhatIfResult
from tracekit.advise.result import AdviseResult
from tracekit.advise.run import advise
from tracekit.analysis import analyze_trace
from tracekit.analysis.analyze import AnalysisResult
from tracekit.report.page import data
from tracekit.report.page.budget import capped_sentence
from tracekit.report.page.request import reported_request, tried_bytes
from tracekit.trace import read_trace
from tracekit.trace.recorded import ExitInfo

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "tracekit" / "report" / "page"
MiB, GiB = 1 << 20, 1 << 30


def test_the_builders_take_typed_results() -> None:
    hints = inspect.get_annotations(data.build_model, eval_str=True)
    assert hints["analysis"] is AnalysisResult
    assert str(hints["whatif"]) == str(WhatIfResult | None)
    assert str(hints["advise"]) == str(AdviseResult | str | None)
    assert inspect.get_annotations(data.answer_of, eval_str=True)["advise"] == AdviseResult | str | None
    assert inspect.get_annotations(data.baseline_view, eval_str=True)["base_analysis"] is AnalysisResult


@pytest.mark.parametrize("path", sorted(PAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_any_and_no_result_read_by_string_key(path: Path) -> None:
    """``Any`` appears nowhere; no result is read by a string key (the page's own JSON shapes are written,
    and read back only by ``columns.decode``, the reference decoder of a ``Column``, and the page's title)."""
    tree = ast.parse(path.read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "Any" not in names
    reads = [n for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Load)
             and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str)
             and not (isinstance(n.value, ast.Name) and n.value.id == "Literal")]
    # The page's own shapes, never a result: a Column in its reference decoder, the model's title.
    allowed = {"columns.py": {"z", "dtype", "delta"}, "html.py": {"title"}}.get(path.name, set())
    assert {n.slice.value for n in reads} <= allowed  # type: ignore[attr-defined]


def test_the_answer_is_advises_own() -> None:
    """The answer block from the typed result says what ``advise --json`` says."""
    r = advise(read_trace(ROOT / "traces" / "cupy-oom-frag.parquet"), jobs=1)
    d = r.as_json()
    a = data.answer_of(r)
    assert a is not None
    best = d["fits"][0]
    assert a["recommendation"] == d["recommendation"] and a["scope"] == d["scope"]
    assert (a["setting"], a["line"], a["verdict"]) == (best["setting"], best["line"], best["verdict"])
    assert a["headroom_bytes"] == best["headroom_bytes"] and a["margin_bytes"] == best["margin_bytes"]
    assert a["verified"] == ("replay" if best["verified_by_replay"] else "model")
    # how it was checked: each of the replay, the device and a real run, done or not (and how to do it)
    assert [c["how"] for c in a["checks"]] == ["replay" if best["verified_by_replay"] else "model", "device",
                                               "real run"]
    assert [c["done"] for c in a["checks"]] == [True, False, False]
    assert "--verify-on-device" in a["checks"][1]["said"] and "--rerun 1" in a["checks"][2]["said"]
    assert a["cures"] == []  # a pool limit ran out: a setting is the answer, no cure of the device budget
    assert data.answer_of("advise could not run") is None and data.answer_of(None) is None
    table = data.advise_table(r)
    assert [row[0] for row in table["rows"]][:1] == [best["setting"]]  # the best verdict first
    assert len(table["rows"]) == len(d["tried"]) and table["columns"][-1] == "why"


def test_ooms_group_by_outcome_site_and_handler() -> None:
    s = analyze_trace(read_trace(ROOT / "traces" / "torch-resnet-fraction.parquet"), timeline=False).summary
    groups, group = data.oom_groups(s.ooms)
    assert [g["handled"] for g in groups] == [False, True, True]
    assert [g["count"] for g in groups] == [1, 2, 2] and groups[0]["ids"] == [4]
    assert group.tolist() == [1, 1, 2, 2, 0]
    assert all("cuDNN" in (g["handler"] or "") for g in groups[1:])
    assert groups[1]["site"] != groups[2]["site"]


def test_the_request_as_pytorch_named_it() -> None:
    assert tried_bytes("CUDA out of memory. Tried to allocate 26.00 MiB. GPU 0 has") == \
        ("Tried to allocate 26.00 MiB", 26 * MiB)
    assert tried_bytes("Out of memory allocating 2,147,483,648 bytes") is None
    t = read_trace(ROOT / "traces" / "torch-handled-oom.parquet")
    s = analyze_trace(t, timeline=False).summary
    o = s.oom
    assert o is not None and not o.handled
    said, why = reported_request(t.meta.recorded.exit, o)
    assert said == "Tried to allocate 122.00 MiB" and why is not None
    assert "121.50 MiB rounded up to a segment (the next multiple of 2 MiB)" in why
    small = dataclasses.replace(o, rounded=int(24.5 * MiB))  # the case: 24.50 MiB, "26.00 MiB"
    ex = ExitInfo(message="CUDA out of memory. Tried to allocate 26.00 MiB.", oom_seq=o.seq)
    said, why = reported_request(ex, small)
    assert said == "Tried to allocate 26.00 MiB" and why is not None and "24.50 MiB" in why
    assert reported_request(ex, dataclasses.replace(o, handled=True)) == (None, None)  # not the fatal one
    assert reported_request(None, o) == (None, None)


def test_the_cap_is_said_where_the_device_had_more_free() -> None:
    assert capped_sentence(int(4.19 * GiB), int(134.96 * GiB)) == (
        "pool capped at 4.19 GiB (pool limit): the device had 134.96 GiB free at the OOM, so the cap ran "
        "out, not the device")
    assert capped_sentence(None, 100 * GiB) is None and capped_sentence(8 * GiB, 2 * GiB) is None


def test_the_answer_lists_the_cures_where_the_device_ran_out() -> None:
    """cupy-seed: the device ran out (another process, the stack limit raised): the cures advise's budget
    shows, the recommended one first and marked, each with the bytes it gives back and its line."""
    r = advise(read_trace(ROOT / "traces" / "cupy-seed.parquet"), jobs=1)
    d = r.as_json()
    a = data.answer_of(r)
    assert a is not None and r.room is not None and r.room.pick is not None
    assert [c["target"] for c in a["cures"]][:1] == [c.target for c in r.room.pick.candidate.cures][:1]
    assert {c["target"] for c in a["cures"]} == {c["target"] for c in d["cures"]}
    assert [c["chosen"] for c in a["cures"]] == [True] + [False] * (len(a["cures"]) - 1)
    chosen = a["cures"][0]
    assert chosen["action"] == a["line"] and chosen["returns_bytes"] > 0 and chosen["how"] == "measured"


def test_the_verdict_says_its_measured_numbers() -> None:
    """One sentence: the request (and the error's own figure), reserved against the limit, free in the pool
    and the largest free block, the device free; without an OOM, the peaks."""
    t = read_trace(ROOT / "traces" / "torch-handled-oom.parquet")
    v = data.build_model(t, analyze_trace(t, timeline=True), "t")["verdict"]["text"]
    assert v == ("fatal OOM at seq 14242 on device 0: fragmentation (121.50 MiB requested; the error said "
                 "\u201cTried to allocate 122.00 MiB\u201d) with 4.08 GiB reserved of the 4.19 GiB pool "
                 "limit, 339.84 MiB free in the pool, largest free block 61.25 MiB; 134.96 GiB free on the "
                 "device.")
    t = read_trace(ROOT / "traces" / "torch-train.parquet")
    v = data.build_model(t, analyze_trace(t, timeline=True), "t")["verdict"]["text"]
    assert v == "No OOM in this trace: peak live 6.89 GiB, peak reserved 14.01 GiB."
