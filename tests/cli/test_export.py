"""``tracekit export TRACE --format FMT [-o OUT] [--force]``, run as a user runs it.

Bad input is one sentence and exit 1; the output goes through the one output policy (never an
input, never replaced without --force, written atomically, nothing left behind on failure).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Events, Op, Source, TraceMeta, write_trace

ROOT = Path(__file__).resolve().parents[2]


def tracekit(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"})


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    op = np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM])
    ev = Events.build(op=op, size=np.array([1000, 2048, 1024, 1 << 20]),
                      rounded=np.array([1024, 2048, 0, 1 << 20]),
                      addr=np.array([0x1000, 0x2000, 0x1000, 0]), site=np.array([0, 1, -1, 1]),
                      sites=("train.py:3:step", "model.py:9:forward"))
    return write_trace(tmp_path / "run.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


def one_error(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 1, res.stderr
    assert res.stdout == "" and res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert res.stderr.startswith("tracekit: error: ")
    return res.stderr


def test_speedscope_by_default_beside_the_trace(trace: Path) -> None:
    res = tracekit("export", trace, "--format", "speedscope")
    assert res.returncode == 0, res.stderr
    out = trace.with_name("run.speedscope.json")
    assert res.stderr == f"Wrote {out}\n"
    assert res.stdout.splitlines() == [
        "live at the peak, seq 1: 3.00 KiB in 2 stacks", "live at the fatal OOM, seq 3: 2.00 KiB in 1 stack",
        "never freed: 2.00 KiB in 1 stack", "all bytes allocated: 3.00 KiB in 2 stacks"]
    assert json.loads(out.read_text())["profiles"][1]["weights"] == [2048]


def test_torch_snapshot_to_the_named_file(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "snap.pickle"
    res = tracekit("export", trace, "-f", "torch-snapshot", "-o", out)
    assert res.returncode == 0, res.stderr
    assert res.stdout == "5 history entries\n" and res.stderr == f"Wrote {out}\n"
    snap = pickle.loads(out.read_bytes())
    assert [e["action"] for e in snap["device_traces"][0]] == [
        "alloc", "alloc", "free_requested", "free_completed", "oom"]


def test_an_existing_output_needs_force(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.json"
    out.write_text("keep")
    err = one_error(tracekit("export", trace, "-f", "speedscope", "-o", out))
    assert err == f"tracekit: error: {out}: already exists; choose another -o or pass --force\n"
    assert out.read_text() == "keep"
    assert tracekit("export", trace, "-f", "speedscope", "-o", out, "--force").returncode == 0
    assert json.loads(out.read_text())["$schema"].startswith("https://www.speedscope.app/")


def test_the_input_is_never_the_output(trace: Path) -> None:
    before = trace.read_bytes()
    err = one_error(tracekit("export", trace, "-f", "torch-snapshot", "-o", trace, "--force"))
    assert "refusing to overwrite the input" in err and trace.read_bytes() == before


@pytest.mark.parametrize("name, cause", [("missing.parquet", "no such file"),
                                         ("not_parquet.parquet", "not_parquet.parquet: "),
                                         ("truncated.parquet", "truncated.parquet: ")])
def test_a_bad_trace_is_one_sentence_and_leaves_nothing(name: str, cause: str, data_dir: Path,
                                                        tmp_path: Path) -> None:
    out = tmp_path / "out.pickle"
    err = one_error(tracekit("export", data_dir / name, "-f", "torch-snapshot", "-o", out))
    assert cause in err
    assert list(tmp_path.iterdir()) == []  # no output, no temporary file


def test_an_output_in_a_missing_folder_is_refused_before_reading(trace: Path, tmp_path: Path) -> None:
    err = one_error(tracekit("export", trace, "-f", "speedscope", "-o", tmp_path / "no" / "x.json"))
    assert err.endswith("does not exist\n")


def test_an_unknown_format_is_a_usage_error(trace: Path) -> None:
    res = tracekit("export", trace, "-f", "flamegraph")
    assert res.returncode == 2 and "'flamegraph' is not one of 'speedscope', 'torch-snapshot'" in res.stderr


def test_the_verb_is_listed_after_report() -> None:
    res = tracekit("--help")
    assert res.returncode == 0
    rows = [line for line in res.stdout.splitlines() if line.startswith("│ ") and line[2:3].strip()]
    verbs = [line.split()[1] for line in rows]  # a verb's first line, not its wrapped ones
    assert verbs.index("export") == verbs.index("report") + 1


def test_a_deep_stack_is_cut_and_the_note_says_how_much(tmp_path: Path) -> None:
    from tracekit.export.depth import MAX_FRAMES
    from tracekit.trace.stacks import StackTable

    n = 3 * MAX_FRAMES  # one chain: stack s = frame s % 2 called from s - 1
    table = StackTable.build(["a.py", "b.py"], [1, 2], ["f", "g"], [0, 0], np.arange(n) % 2, np.arange(n) - 1)
    ev = Events.build(np.array([Op.MALLOC]), np.array([512]), addr=np.array([0x1000]),
                      stack=np.array([n - 1], np.int32), stacks=table)
    path = write_trace(tmp_path / "deep.parquet", TraceMeta.new(Source.SYNTHETIC), ev)
    for fmt, out in (("torch-snapshot", tmp_path / "deep.pickle"), ("speedscope", tmp_path / "deep.json")):
        res = tracekit("export", path, "-f", fmt, "-o", out)
        assert res.returncode == 0, res.stderr
        assert res.stderr == (f"tracekit: note: {path}: 1 stack deeper than {MAX_FRAMES} frames written as "
                              f"their innermost {MAX_FRAMES} ({n - MAX_FRAMES} outer frames left out)\n"
                              f"Wrote {out}\n")
    frames = pickle.loads((tmp_path / "deep.pickle").read_bytes())["device_traces"][0][0]["frames"]
    assert len(frames) == MAX_FRAMES and frames[0]["filename"] == "b.py"


def test_help_names_the_default_output() -> None:
    res = tracekit("export", "--help")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())
    assert "File to write ." not in text
    assert "default: TRACE with .speedscope.json or .pickle in place of .parquet" in text.replace("│ ", "")
