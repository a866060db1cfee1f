"""``tracekit replay``: options, outputs and exit codes, through CliRunner and a subprocess."""

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

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """Four 1 KiB blocks, free #0 and #2, then ask for 2 KiB: fragmentation in a 4 KiB heap."""
    op = np.array([Op.MALLOC] * 4 + [Op.FREE, Op.FREE, Op.MALLOC], np.int8)
    size = np.array([1024] * 6 + [2048], np.uint64)
    addr = np.array([1, 2, 3, 4, 1, 3, 5], np.uint64) * 4096
    path = tmp_path / "small.parquet"
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), Events.build(op, size, addr=addr))
    return path


def invoke(*args: str):
    return runner.invoke(app, ["replay", *args])


def test_text_summary(small: Path) -> None:
    r = invoke(str(small), "--sim", "best-fit")
    assert r.exit_code == 0, r.output
    assert "best-fit" in r.stdout and "out of memory  no" in r.stdout


def test_json_summary_with_oom(small: Path) -> None:
    r = invoke(str(small), "--sim", "first-fit", "--capacity", "4KiB", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["policy"] == "first-fit" and d["capacity"] == 4096 and d["events"] == 7
    assert d["oom"]["seq"] == 6 and d["oom"]["largest_free_block"] == 1024
    assert d["oom"]["free_bytes"] == 2048 and d["oom"]["cause"] == "fragmentation"


def test_output_trace_and_fail_on_oom(small: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.parquet"
    r = invoke(str(small), "--sim", "best-fit", "--capacity", "4096", "-o", str(out), "--fail-on-oom")
    assert r.exit_code == 3
    assert f"Wrote {out}" in r.stderr and "out of memory under best-fit at seq 6" in r.stderr
    back = read_trace(out)  # written before the verdict
    assert back.meta.source == Source.REPLAY and back.events.op[-1] == Op.OOM


def test_continue_on_oom_counts_every_failure(tmp_path: Path) -> None:
    op = np.array([Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.FREE], np.int8)
    size = np.array([3072, 3072, 3072, 3072], np.uint64)
    path = tmp_path / "t.parquet"
    write_trace(path, TraceMeta.new(Source.SYNTHETIC),
                Events.build(op, size, addr=np.array([1, 2, 3, 2], np.uint64)))
    r = invoke(str(path), "--sim", "worst-fit", "--capacity", "4KiB", "--json", "--continue-on-oom")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["oom_count"] == 2 and d["oom"]["seq"] == 1


def test_torch_conf_reaches_the_policy(small: Path) -> None:
    r = invoke(str(small), "--sim", "first-fit", "--torch-conf", "max_split_size_mb:256")
    assert r.exit_code == 2 and "takes no options" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--sim", "bestfit"], "choose one of"),
    ([], "exactly one of --sim"),
    (["--sim", "best-fit", "--device", "0"], "exactly one of --sim"),
    (["--sim", "best-fit", "--compare-sim", "cupy"], "--compare-sim applies to --device"),
    (["--sim", "best-fit", "--capacity", "lots"], "invalid --capacity"),
    (["--sim", "best-fit", "--device-total", "-1"], "invalid --device-total"),
    (["--sim", "torch", "--torch-conf", "nonsense"], "invalid --torch-conf"),
    (["--device", "0", "--torch-conf", "a:b"], "apply to --sim"),
])
def test_usage_errors(small: Path, args: list[str], needle: str) -> None:
    r = invoke(str(small), *args)
    assert r.exit_code == 2, r.output
    assert needle in r.stderr


def test_refuses_to_overwrite_the_input(small: Path) -> None:
    before = small.read_bytes()
    r = invoke(str(small), "--sim", "best-fit", "-o", str(small))
    assert r.exit_code == 1 and "refusing to overwrite" in r.stderr
    assert small.read_bytes() == before


@pytest.mark.parametrize("name", ["truncated.parquet", "not_parquet.parquet", "missing_column.parquet"])
def test_bad_trace_is_one_sentence(data_dir: Path, name: str) -> None:
    r = invoke(str(data_dir / name), "--sim", "best-fit")
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracekit: error: ") and name in lines[0]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", "replay", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)


def test_exit_codes_through_a_subprocess(small: Path, tmp_path: Path) -> None:
    assert _run(str(small), "--sim", "best-fit").returncode == 0
    assert _run(str(small), "--sim", "best-fit", "--capacity", "4KiB", "--fail-on-oom").returncode == 3
    assert _run(str(small), "--sim", "no-such").returncode == 2
    missing = _run(str(tmp_path / "missing.parquet"), "--sim", "best-fit")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.count("\n") == 1


def test_device_mode_hands_over_to_the_device_replay(small: Path, monkeypatch) -> None:
    import tracekit.device.command as command

    calls: list[tuple] = []

    from tracekit.sim.result import ReplaySummary

    one = ReplaySummary("cupy-async", 1 << 30, None, 2, 512, 2 << 20, None, 1, 0, None, 1, False)

    def fake(*a, **kw):
        calls.append((a, kw))
        return command.DeviceReplayOutcome(one, None, None, "1 allocation(s) ran out")

    monkeypatch.setattr(command, "run_device_replay", fake)
    r = invoke(str(small), "--device", "1", "--allocator", "cupy-async", "--capacity", "1GiB",
               "--compare-sim", "cupy", "--json", "--fail-on-oom")
    assert r.exit_code == 3, r.output  # --fail-on-oom turns the outcome's verdict into exit code 3
    assert json.loads(r.stdout) == one.to_dict()
    (args, kw), = calls
    assert args == (small,)
    assert kw == {"device": 1, "allocator": "cupy-async", "capacity": "1GiB", "output": None,
                  "continue_on_oom": False, "compare_sim": "cupy", "force": False, "torch_conf": None,
                  "stop_at_first_oom": False}


def test_progress_bar_only_on_a_terminal_and_long_traces() -> None:
    import io

    from tracekit.cli import replay as cli

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    from tracekit.progress import Progress

    err = Tty()
    bar = Progress("replaying", stream=err, enabled=err.isatty(), min_total=cli.PROGRESS_MIN_EVENTS)
    bar(1 << 20, 5_000)  # short trace: no bar
    bar.close()
    assert err.getvalue() == ""
    bar(1 << 20, 3 << 20)
    bar(3 << 20, 3 << 20)
    bar.close()
    assert "replaying" in err.getvalue() and "100.0%" in err.getvalue()


def test_a_pool_stopped_by_its_limit_is_named_as_analyze_names_it() -> None:
    """torch-oom: 1.95 GiB asked with 823 MiB free in the pool's blocks (the largest 226 MiB) and
    1.81 GiB its limit left unreserved: enough together, in no one piece, so a new segment would
    pass the limit. The replay says "limit" (not "exhausted": the bytes were there), as analyze says
    of the recorded request; a heap, which reserves its whole capacity, is unchanged."""
    trace = str(ROOT / "traces" / "torch-oom.parquet")
    r = runner.invoke(app, ["replay", trace, "--sim", "torch", "--json"])
    assert r.exit_code == 0, r.output
    oom = json.loads(r.stdout)["oom"]
    assert oom["free_bytes"] < oom["rounded"] and oom["cause"] == "limit"
    a = runner.invoke(app, ["analyze", trace, "--json"])
    assert json.loads(a.stdout)["oom"]["diagnosis"] == "limit"
    text = runner.invoke(app, ["replay", trace, "--sim", "torch"]).stdout
    assert "cause: limit (" in text
    heap = runner.invoke(app, ["replay", str(ROOT / "traces" / "cupy-oom-frag.parquet"), "--sim", "buddy",
                               "--capacity", "200MiB", "--json"])
    assert json.loads(heap.stdout)["oom"]["cause"] == "exhausted"
