"""``replay --sim cuda|cupy-async`` and ``whatif --policies cuda,cupy-async`` from the command line.

The worked trace: three live blocks of 1 MiB + 1 B (3 MiB + 1.5 KiB live). cudaMalloc takes a
whole 2 MiB page for each (6 MiB); the async pool packs the live bytes into pages (4 MiB). Under a
5 MiB capacity cudaMalloc fails the third request, with 1 MiB free (4 MiB taken) and no block
above 1 MiB left to give; the async pool fits. A recording replayed through them is the
prediction advise makes (it goes through the counterfactual input like any pool policy).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def three(tmp_path: Path) -> Path:
    op = np.array([Op.MALLOC] * 3, np.int8)
    addr = np.array([1, 2, 3], np.uint64) * 0x1000_0000
    ev = Events.build(op, np.full(3, MiB + 1, np.uint64), addr=addr)
    return write_trace(tmp_path / "three.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


def replay_json(*args: str) -> dict:
    r = runner.invoke(app, ["replay", *args, "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_replay_sim_cuda_and_cupy_async(three: Path) -> None:
    cuda, pool = replay_json(str(three), "--sim", "cuda"), replay_json(str(three), "--sim", "cupy-async")
    assert (cuda["peak_reserved_bytes"], pool["peak_reserved_bytes"]) == (6 * MiB, 4 * MiB)
    assert cuda["peak_live_bytes"] == pool["peak_live_bytes"] == 3 * MiB + 1536
    assert cuda["segment_allocs"] == pool["segment_allocs"] == 0 and cuda["peak_extent"] is None
    tight = replay_json(str(three), "--sim", "cuda", "--capacity", "5MiB")
    assert tight["oom"]["seq"] == 2 and tight["oom"]["free_bytes"] == MiB
    assert tight["oom"]["largest_free_block"] == MiB and tight["oom"]["reserved_bytes"] == 4 * MiB
    assert replay_json(str(three), "--sim", "cupy-async", "--capacity", "5MiB")["oom"] is None


def test_replay_sim_cuda_writes_a_trace(three: Path, tmp_path: Path) -> None:
    out = tmp_path / "cuda.parquet"
    p = subprocess.run([sys.executable, "-m", "tracekit", "replay", str(three), "--sim", "cuda", "--capacity",
                        "5MiB", "--fail-on-oom", "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 3, p.stderr  # it does not fit: the written trace ends in the oom row
    back = read_trace(out, strict=True)
    assert back.meta.source == Source.REPLAY and back.meta.extra["policy"] == "cuda"
    assert [Op(o).label for o in back.events.op] == ["malloc", "malloc", "oom"]
    a, b = (int(x) for x in back.events.addr[:2])
    assert a % (2 * MiB) == b % (2 * MiB) == 0 and b - a == 2 * MiB  # pages, not overlapping


def test_the_policies_are_listed_and_take_no_options(three: Path) -> None:
    r = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "400"})
    pools = r.stdout.split("(one heap")[1]
    assert "cuda" in pools and "cupy-async" in pools
    r = runner.invoke(app, ["replay", str(three), "--sim", "cupy-async", "--torch-conf", "ties:address"])
    assert r.exit_code == 2 and "cupy-async takes no options" in r.output


def test_whatif_searches_them_by_name(three: Path) -> None:
    r = runner.invoke(app, ["whatif", str(three), "--policies", "cuda,cupy-async", "--json", "--jobs", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["lower_bound_bytes"] == 3 * MiB + 1536
    assert {p["policy"]: p["min_capacity_bytes"] for p in doc["policies"]} == {"cuda": 6 * MiB,
                                                                               "cupy-async": 4 * MiB}
    r = runner.invoke(app, ["whatif", str(three), "--json", "--jobs", "1"])
    assert r.exit_code == 0 and {"cuda", "cupy-async"}.isdisjoint(p["policy"] for p in json.loads(r.stdout)
                                                                  ["policies"])  # named only


def test_a_recording_replays_as_advise_predicts_it() -> None:
    """cupy-oom-frag at 256 MiB: cudaMalloc fits at a peak of 228,589,568 B, the figure
    ``advise`` gives its plain-cudaMalloc candidate and the H200's device replay measured."""
    trace = ROOT / "traces" / "cupy-oom-frag.parquet"
    if not trace.exists():
        pytest.skip("trace not committed")
    d = replay_json(str(trace), "--sim", "cuda", "--capacity", "256MiB")
    assert d["oom"] is None and d["peak_reserved_bytes"] == 228_589_568
    d = replay_json(str(trace), "--sim", "cuda")  # no --capacity: cudaMalloc has no recorded pool limit
    assert d["capacity"] is None
