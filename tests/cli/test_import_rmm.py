"""``tracekit import rmm``: the verb end to end, its refusals, and the verbs that read its traces."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import Source, read_trace

runner = CliRunner()
HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
MiB = 1 << 20


def _log(path: Path, n_steps: int = 20) -> Path:
    """A training-like log: per step a 64 MiB buffer and a 1 MiB one, the first freed a step later."""
    lines, t = [HEADER], 0
    for k in range(n_steps):
        for b, size in ((2 * k, 64 * MiB), (2 * k + 1, MiB)):
            t += 10
            lines.append(f"4242,11:00:00.{t:06d},allocate,{0x7F0000000000 + b * (1 << 28):#x},{size},0\n")
        t += 10
        small = 0x7F0000000000 + (2 * k + 1) * (1 << 28)
        lines.append(f"4242,11:00:00.{t:06d},free,{small:#x},{MiB},0\n")
        if k:
            t += 10
            lines.append(f"4242,11:00:00.{t:06d},free,{0x7F0000000000 + 2 * (k - 1) * (1 << 28):#x},"
                         f"{64 * MiB},0\n")
    path.write_text("".join(lines))
    return path


def test_import_then_replay_and_whatif(tmp_path: Path) -> None:
    log = _log(tmp_path / "train.dev1.csv")
    r = runner.invoke(app, ["import", "rmm", str(log)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "train.dev1.parquet"
    trace = read_trace(out)
    assert trace.meta.source == Source.RMM and set(trace.events.device.tolist()) == {1}
    assert trace.issues == ()  # every free pairs with its allocate
    r = runner.invoke(app, ["replay", str(out), "--sim", "rmm-pool", "--capacity", "160MiB", "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    # max 160 MiB: 64 MiB grows the pool by 80 MiB (remaining / 2), 1 MiB fits its rest; the next
    # 64 MiB grows it by max(64, 80 / 2) = 64 MiB to 144 MiB; from then on two 64 MiB blocks alternate.
    assert summary["oom"] is None and summary["peak_reserved_bytes"] == 144 * MiB
    r = runner.invoke(app, ["replay", str(out), "--sim", "rmm-pool", "--capacity", "100MiB", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["oom"]["seq"] == 3  # the second 64 MiB request
    r = runner.invoke(app, ["whatif", str(out), "--policies", "rmm-pool,best-fit", "--json"])
    assert r.exit_code == 0, r.output
    fits = {f["policy"]: f["min_capacity_bytes"] for f in json.loads(r.stdout)["policies"]}
    assert fits["best-fit"] <= fits["rmm-pool"] <= 160 * MiB


def test_an_existing_output_needs_force(tmp_path: Path) -> None:
    log = _log(tmp_path / "a.csv", 2)
    out = tmp_path / "a.parquet"
    out.write_bytes(b"keep")
    r = runner.invoke(app, ["import", "rmm", str(log)])
    assert r.exit_code == 1 and out.read_bytes() == b"keep"
    assert runner.invoke(app, ["import", "rmm", str(log), "--force"]).exit_code == 0
    assert runner.invoke(app, ["import", "rmm", str(log), "-o", str(log)]).exit_code == 1  # the input itself


def test_a_malformed_log_is_one_sentence_and_exit_1(tmp_path: Path) -> None:
    log = tmp_path / "bad.dev0.csv"
    log.write_text(HEADER + "1,10:00:00.000001,allocate,0x100,256,0\n1,10:00:00.000002,free,0x100,2e3,0\n")
    p = subprocess.run([sys.executable, "-m", "tracekit", "import", "rmm", str(log)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.strip() == (f"tracekit: error: {log}: line 3: the Size field '2e3' is not a byte count "
                                "below 2^60")
    assert not (tmp_path / "bad.dev0.parquet").exists()
    for args in (["import", "rmm", str(tmp_path / "none.csv")], ["import", "rmm", str(tmp_path)]):
        r = runner.invoke(app, args)
        assert r.exit_code == 1


@pytest.mark.parametrize("body, said", [
    # a line of 7 fields whose text is not UTF-8: Arrow cannot hand it to the row handler
    (b"1,10:00:00.000002,allocate,0x20,100,0,caf\xe9\n",
     "line 3: expected the 6 fields Thread,Time,Action,Pointer,Size,Stream, got 7"),
    # a block no reader would take: it runs past the end of the address space
    (b"1,10:00:00.000002,allocate,0xffffffffffffffff,100,0\n",
     "line 3: a block of 256 bytes at 0xffffffffffffffff would run past the end of the 64-bit address space"),
])
def test_a_line_no_trace_can_hold_is_named(tmp_path: Path, body: bytes, said: str) -> None:
    log = tmp_path / "odd.dev0.csv"
    log.write_bytes(HEADER.encode() + b"1,10:00:00.000001,allocate,0x10,100,0\n" + body)
    p = subprocess.run([sys.executable, "-m", "tracekit", "import", "rmm", str(log)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1 and "Traceback" not in p.stderr and "Exception ignored" not in p.stderr
    assert p.stderr.strip() == f"tracekit: error: {log}: {said}"
    assert not (tmp_path / "odd.dev0.parquet").exists()


@pytest.mark.skipif(importlib.util.find_spec("rmm") is not None, reason="RMM is installed here")
def test_the_device_replay_of_rmm_pool_without_rmm_says_how_to_get_it(tmp_path: Path) -> None:
    log = _log(tmp_path / "a.csv", 2)
    assert runner.invoke(app, ["import", "rmm", str(log)]).exit_code == 0
    r = runner.invoke(app, ["replay", str(tmp_path / "a.parquet"), "--device", "0",
                            "--allocator", "rmm-pool"])
    assert r.exit_code != 0 and "needs RMM (pip install rmm-cu12 or rmm-cu13)" in r.output
    assert "Traceback" not in r.output and r.output.count("\n") == 1


def test_advise_offers_rmms_own_settings_and_judges_its_pool_by_its_replay(tmp_path: Path) -> None:
    """advise on an RMM trace: RMM's pool (the recorded setting), its async resource and no pool, each
    with RMM's own line; the pool's figure is its replay's (at 140 MiB: 64 MiB grows the pool by
    max(64, 140 / 2) = 70 MiB, the next 64 MiB by max(64, 70 / 2) = 64 MiB: 134 MiB, 6 MiB headroom,
    above the 2 % margin of 2.8 MiB); below the live peak (128 MiB) nothing fits."""
    log = _log(tmp_path / "train.dev0.csv")
    assert runner.invoke(app, ["import", "rmm", str(log)]).exit_code == 0
    out = tmp_path / "train.dev0.parquet"
    r = runner.invoke(app, ["advise", str(out), "--limit", "140MiB", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["kind"] == "rmm-pool"
    tried = {o["kind"]: o for o in got["tried"]}
    assert set(tried) == {"rmm-pool", "rmm-cuda-async", "rmm-cuda"}
    pool = tried["rmm-pool"]
    assert pool["verdict"] == "fits" and pool["peak_reserved_bytes"] == 134 * MiB
    assert pool["verified_by_replay"]
    # the initial size said: RMM's default (half the free memory) above the maximum is refused
    line = "rmm.reinitialize(pool_allocator=True, initial_pool_size=0, maximum_pool_size="
    assert line in got["recommendation"]
    r = runner.invoke(app, ["advise", str(out), "--limit", "120MiB", "--json"])
    assert r.exit_code == 0, r.output
    assert all(o["verdict"] == "no" for o in json.loads(r.stdout)["tried"])
