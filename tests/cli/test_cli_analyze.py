"""``tracekit analyze`` through CliRunner and a subprocess (exit codes, messages, outputs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tracekit.analysis import TIMELINE_COLUMNS
from tracekit.cli.app import app
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def frag_trace(tmp_path: Path) -> Path:
    """The fragmentation case: 6 MiB free in two 3 MiB holes, a 4 MiB request fails."""
    S = 0x7F00_0000_0000
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE, Op.OOM])
    addr = np.array([S, S, S + 3 * MiB, S + 5 * MiB, S + 8 * MiB, S, S + 5 * MiB, 0], np.uint64)
    size = np.array([10, 3, 2, 3, 2, 3, 3, 4], np.uint64) * MiB
    rounded = np.where(op == Op.FREE, 0, size).astype(np.uint64)
    ev = Events.build(op, size, addr=addr, rounded=rounded, site=np.array([-1, 0, 1, 0, 1, -1, -1, 0]),
                      sites=("train.py:3:step", "train.py:9:cache"))
    dev = DeviceInfo("H200", 80 << 30, 79 << 30)
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=10 * MiB, device=dev)
    return write_trace(tmp_path / "frag.parquet", meta, ev)


def test_json_summary(frag_trace: Path):
    r = runner.invoke(app, ["analyze", str(frag_trace), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    for key in ("events", "duration_s", "peak_live_bytes", "peak_live_seq", "peak_requested_bytes",
                "peak_reserved_bytes", "peak_reserved_seq", "max_external_fragmentation",
                "min_largest_free_block", "jw1", "jw2", "jw3", "jw4", "oom", "leaks"):
        assert key in d
    assert d["events"] == 8 and d["oom"]["seq"] == 7 and d["oom"]["diagnosis"] == "fragmentation"
    assert d["oom"]["largest_free_block"] == 3 * MiB and d["oom"]["free_in_pool"] == 6 * MiB
    assert d["device_total_bytes"] == 80 << 30 and d["overhead_bytes"] == 1 << 30


def test_text_summary(frag_trace: Path):
    r = runner.invoke(app, ["analyze", str(frag_trace)])
    assert r.exit_code == 0, r.output
    assert "FRAGMENTATION" in r.stdout and "largest free block was only 3.00 MiB" in r.stdout


def test_timeline_file(frag_trace: Path, tmp_path: Path):
    out = tmp_path / "tl.parquet"
    r = runner.invoke(app, ["analyze", str(frag_trace), "--timeline", str(out)])
    assert r.exit_code == 0, r.output
    assert f"Wrote {out}" in r.stderr
    t = pq.read_table(out)
    assert tuple(t.column_names) == TIMELINE_COLUMNS and t.num_rows == 8
    assert t.column("largest_free_block").to_pylist()[-1] == 3 * MiB
    assert str(t.schema.field("device_free").type) == "int64"
    assert str(t.schema.field("external_fragmentation").type) == "double"


def test_timeline_refuses_to_overwrite_the_input(frag_trace: Path):
    before = frag_trace.read_bytes()
    r = runner.invoke(app, ["analyze", str(frag_trace), "--timeline", str(frag_trace)])
    assert r.exit_code == 1
    assert "refusing to overwrite the input" in r.stderr and "choose another --timeline" in r.stderr
    r = runner.invoke(app, ["analyze", str(frag_trace), "--report", str(frag_trace)])
    assert r.exit_code == 1 and "choose another --report" in r.stderr
    assert frag_trace.read_bytes() == before


def test_report_option_writes_html(frag_trace: Path, tmp_path: Path):
    out = tmp_path / "report.html"
    r = runner.invoke(app, ["analyze", str(frag_trace), "--report", str(out)])
    assert r.exit_code == 0, r.output
    assert out.exists() and out.read_text().lstrip().lower().startswith("<!doctype html")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", "analyze", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_not_a_trace_is_one_sentence_and_exit_1(tmp_path: Path):
    bad = tmp_path / "notes.parquet"
    bad.write_text("this is not parquet\n")
    p = _run(str(bad))
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("tracekit: error: ")
    assert str(bad) in p.stderr and "Traceback" not in p.stderr


def test_missing_file_exit_1(tmp_path: Path):
    p = _run(str(tmp_path / "nope.parquet"))
    assert p.returncode == 1 and "no such file" in p.stderr and "Traceback" not in p.stderr


def test_subprocess_json_ok(frag_trace: Path):
    p = _run(str(frag_trace), "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["oom"]["diagnosis"] == "fragmentation"


def test_missing_timeline_folder_is_an_error_before_reading(frag_trace: Path, tmp_path: Path):
    r = runner.invoke(app, ["analyze", str(frag_trace), "--timeline", str(tmp_path / "no" / "tl.parquet")])
    assert r.exit_code == 1 and "does not exist" in r.stderr
