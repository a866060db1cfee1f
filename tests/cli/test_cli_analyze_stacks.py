"""``analyze``/``advise``/``fleet`` on a trace with whole stacks (format v3): the user's own line,
``--user-code``, ``analyze --tree``; and the committed real traces keep their wording."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.stacks import FrameKind, StackTable

MiB = 1 << 20
runner = CliRunner()
VENV = "/venv/lib/python3.12/site-packages"
RESNET = f"{VENV}/torchvision/models/resnet.py"
EVIL = "evil\x1b[2J.py"

# Stacks (innermost frame, parent): 0 main <- 1 step <- 2 resnet.py:151 (library)
#                                    0 main <- 3 cache (user)    0 main <- 4 EVIL (user, hostile name)
STACKS = StackTable.build(
    ["train.py", "train.py", RESNET, "train.py", EVIL], [120, 88, 151, 9, 1],
    ["main", "step", "forward", "cache", "f\nFAKE"], [FrameKind.USER, FrameKind.USER, FrameKind.LIBRARY,
                                                     FrameKind.USER, FrameKind.USER],
    range(5), [-1, 0, 1, 0, 0])


@pytest.fixture
def v3_trace(tmp_path: Path) -> Path:
    """One 10 MiB segment: 3 MiB at stack 2, 2 MiB at 3, 3 MiB at 2, 1 MiB at 4 (peak: 9 MiB live);
    the first freed; a 4 MiB request at stack 2 fails (fragmentation: 3 + 1 MiB free in two holes)."""
    S = 0x7F00_0000_0000
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM])
    addr = np.array([S, S, S + 3 * MiB, S + 5 * MiB, S + 8 * MiB, S, 0], np.uint64)
    size = np.array([10, 3, 2, 3, 1, 3, 4], np.uint64) * MiB
    rounded = np.where(op == Op.FREE, 0, size).astype(np.uint64)
    stack = np.array([-1, 2, 3, 2, 4, -1, 2], np.int32)
    ev = Events.build(op, size, addr=addr, rounded=rounded, site=np.full(len(op), -1, np.int32),
                      stack=stack, stacks=STACKS)
    dev = DeviceInfo("H200", 80 << 30, 79 << 30)
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=10 * MiB, device=dev)
    return write_trace(tmp_path / "v3.parquet", meta, ev)


def analyze(*args: str) -> tuple[str, dict | None]:
    r = runner.invoke(app, ["analyze", *args])
    assert r.exit_code == 0, r.output
    return r.stdout, json.loads(r.stdout) if "--json" in args else None


def test_the_oom_names_the_users_line_and_the_request(v3_trace: Path) -> None:
    _, d = analyze(str(v3_trace), "--json")
    assert d is not None
    o = d["oom"]
    assert o["site"] == f"train.py:88 in step → {RESNET}:151"
    assert o["user_site"] == "train.py:88:step" and o["request_site"] == f"{RESNET}:151:forward"
    assert o["stack"] == [f"{RESNET}:151:forward", "train.py:88:step", "train.py:120:main"]
    assert o["stack_left_out"] == 0
    # Live at the OOM: 2 MiB at cache, 3 MiB at step → resnet, 1 MiB at EVIL (the first block was freed).
    assert [(s["site"], s["bytes"]) for s in o["top_live_sites"]] == [
        (f"train.py:88 in step → {RESNET}:151", 3 * MiB), ("train.py:9:cache", 2 * MiB),
        (f"{EVIL}:1:f\nFAKE", MiB)]
    assert d["ooms"][0]["user_site"] == "train.py:88:step" and "stack" not in d["ooms"][0]


def test_user_code_changes_the_answer(v3_trace: Path) -> None:
    _, d = analyze(str(v3_trace), "--json", "--user-code", f"{VENV}/torchvision")
    assert d is not None
    assert d["oom"]["site"] == f"{RESNET}:151:forward" and d["oom"]["user_site"] == f"{RESNET}:151:forward"
    assert d["leaks"][1] == {"site": "train.py:9:cache", "user_site": None,
                             "request_site": "train.py:9:cache", "bytes": 2 * MiB, "blocks": 1}


def test_tree_json_numbers(v3_trace: Path) -> None:
    _, d = analyze(str(v3_trace), "--json", "--tree")
    assert d is not None
    t = d["trees"]
    assert t["peak_seq"] == 4 and t["peak"]["bytes"] == d["peak_live_bytes"] == 9 * MiB
    (main,) = t["peak"]["children"]
    assert (main["frame"], main["bytes"], main["blocks"], main["user"]) == \
        ("train.py:120 in main", 9 * MiB, 4, True)
    assert [(c["frame"], c["bytes"]) for c in main["children"]] == [
        ("train.py:88 in step", 6 * MiB), ("train.py:9 in cache", 2 * MiB), (f"{EVIL}:1 in f\nFAKE", MiB)]
    step = main["children"][0]
    assert step["children"][0]["frame"] == f"{RESNET}:151 in forward" and not step["children"][0]["user"]
    assert [(o["seq"], o["handled"], o["tree"]["bytes"]) for o in t["ooms"]] == [(6, False, 6 * MiB)]
    assert t["never_freed"]["bytes"] == 6 * MiB and t["ooms_without_tree"] == 0


def test_tree_text_is_bounded_marked_and_escaped(v3_trace: Path) -> None:
    out, _ = analyze(str(v3_trace), "--tree")
    assert "\x1b" not in out and "evil\\x1b[2J.py:1 in f\\nFAKE" in out
    assert "\nFAKE" not in out  # a newline in a frame cannot start a line of its own
    lines = out.splitlines()
    head = lines.index(next(x for x in lines if "live at the peak of live bytes (after seq 4)" in x))
    assert lines[head + 1].split()[:4] == ["9.00", "MiB", "100.0%", "*"]
    assert any("live at the fatal OOM at seq 6" in x for x in lines)
    assert any("never freed (live at the end)" in x for x in lines)


def test_advise_and_fleet_name_the_users_line(v3_trace: Path) -> None:
    r = runner.invoke(app, ["advise", str(v3_trace), "--json", "--jobs", "1"])
    assert r.exit_code == 0, r.output
    top = json.loads(r.stdout)["top_sites_at_peak"][0]
    assert top["site"] == f"train.py:88 in step → {RESNET}:151" and top["user_site"] == "train.py:88:step"
    r = runner.invoke(app, ["fleet", str(v3_trace), "--json", "--jobs", "1", "--user-code", "elsewhere"])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["rows"]
    assert row["oom_site"] == f"{RESNET}:151:forward" and row["oom_user_site"] is None
    r = runner.invoke(app, ["fleet", str(v3_trace), "--json", "--jobs", "1"])
    (row,) = json.loads(r.stdout)["rows"]
    assert row["oom_user_site"] == "train.py:88:step" and row["oom_request_site"] == f"{RESNET}:151:forward"


@pytest.mark.parametrize("verb", [["analyze"], ["advise", "--jobs", "1"], ["fleet", "--jobs", "1"]])
def test_a_user_code_path_under_no_frame_is_said(v3_trace: Path, tmp_path: Path, verb: list[str]) -> None:
    if verb[0] == "fleet":
        pytest.importorskip("polars")
    nowhere = str(tmp_path / "nowhere")
    args = [verb[0], str(v3_trace), *verb[1:], "--user-code", nowhere, "--user-code", "train.py"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    note = f"tracekit: note: no frame of {v3_trace} lies under {nowhere}"
    assert [x for x in r.stderr.splitlines() if "note:" in x] == [note]  # train.py holds frames: no note
    assert note not in r.stdout


@pytest.mark.parametrize("name", ["torch-handled-oom.parquet", "cupy-oom-frag.parquet",
                                  "torch-gpt2-lengths.parquet"])
def test_real_traces_keep_their_sites_and_draw_trees(traces_dir: Path, name: str) -> None:
    """Every request frame is the recorded one-frame call-site (the ``site`` column: a format-1/2
    trace's label, a format-3 trace's request side, its label adding the user's line), and the
    trees add up."""
    from tracekit.analysis import analyze_trace
    from tracekit.analysis.tree import TreeLimits
    from tracekit.trace import read_trace

    tr = read_trace(traces_dir / name)
    s = analyze_trace(tr, timeline=False, trees=TreeLimits()).summary
    recorded = set(tr.events.sites) | {None}
    assert {o.request_site for o in s.ooms} <= recorded and {x.request_site for x in s.leaks} <= recorded
    one_frame = tr.events.stacks.n_stacks == len(tr.events.sites)  # StackTable.from_sites
    if one_frame:
        assert {o.site for o in s.ooms} <= recorded and {x.site for x in s.leaks} <= recorded
    assert s.trees is not None and s.trees.never_freed.bytes == s.leaked_bytes
    assert s.trees.peak is not None and s.trees.peak.bytes == s.peak_live_bytes
    assert len(s.trees.ooms) == min(len(s.ooms), 8)


def test_tree_of_ten_thousand_distinct_stacks_is_bounded(tmp_path: Path) -> None:
    """10,000 live blocks, each of its own stack (100 outer frames x 100 inner ones): every tree
    prints at most its node budget, each cut counted, and the totals still add up."""
    from tracekit.analysis.tree import TreeLimits

    n_outer, per = 100, 100
    n = n_outer * per
    files = [f"outer{i}.py" for i in range(n_outer)] + [f"{VENV}/lib{j % 7}/m.py" for j in range(n)]
    kinds = [FrameKind.USER] * n_outer + [FrameKind.LIBRARY] * n
    parent = [-1] * n_outer + [j // per for j in range(n)]
    table = StackTable.build(files, [1 + j for j in range(len(files))], ["f"] * len(files), kinds,
                             range(len(files)), parent)
    size = (np.arange(n, dtype=np.uint64) % 97 + 1) * 512
    addr = np.arange(n, dtype=np.uint64) * (1 << 20)
    ev = Events.build(np.full(n, Op.MALLOC), size, addr=addr, rounded=size,
                      stack=np.arange(n_outer, n_outer + n, dtype=np.int32), stacks=table)
    path = write_trace(tmp_path / "wide.parquet", TraceMeta.new(Source.SYNTHETIC), ev)
    out, _ = analyze(str(path), "--tree")
    budget = TreeLimits().max_nodes
    start = out.index("live bytes by call stack")
    lines = out[start:].splitlines()
    # Two trees (the peak, never freed), each a title, its nodes and at most one "more" line a node.
    assert len(lines) <= 2 * (2 + 2 * budget) + 4
    assert any("… " in x and " more (" in x for x in lines)
    _, d = analyze(str(path), "--tree", "--json")
    assert d is not None
    peak = d["trees"]["peak"]
    assert peak["bytes"] == int(size.sum()) == d["peak_live_bytes"]

    def count(node: dict) -> int:
        return 1 + sum(count(c) for c in node["children"])

    def shown(node: dict) -> int:  # the bytes of the children kept plus what was cut add up
        assert sum(c["bytes"] for c in node["children"]) + node["more_bytes"] <= node["bytes"]
        return sum(shown(c) for c in node["children"]) + 1

    assert count(peak) <= budget + 1 and shown(peak) == count(peak)


def test_fleet_summary_escapes_each_call_site() -> None:
    pytest.importorskip("polars")
    from tracekit.fleet.summary import FleetSummary, Group

    s = FleetSummary(traces=1, analyzed=1, out_of_memory=1, by_diagnosis=(),
                     by_site=(Group(f"{EVIL}:1:f\nFAKE", 1, (3,), ("a.parquet",)),), imbalance=None,
                     worst=None, errors=())
    text = s.to_text()
    assert "\nFAKE" not in text and "\x1b" not in text and "evil\\x1b[2J.py:1:f\\nFAKE  (rank 3)" in text
