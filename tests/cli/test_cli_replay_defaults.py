"""Pool replays default to the limit the trace was recorded under (real H200 traces)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tracekit.cli.app import app

TRACES = Path(__file__).resolve().parents[2] / "traces"
runner = CliRunner()


def _replay(*args: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["replay", *args, "--json"])
    return res.exit_code, json.loads(res.stdout) if res.stdout.strip() else {}


def test_recorded_pool_limit_is_the_default() -> None:
    # CuPy recorded this trace under set_limit(256 MiB); the 64 MiB request at seq 164 failed there.
    code, d = _replay(str(TRACES / "cupy-oom-frag.parquet"), "--sim", "cupy")
    assert code == 0
    assert d["capacity"] == 256 << 20
    assert d["oom"]["seq"] == 164


def test_capacity_none_lifts_the_recorded_limit() -> None:
    code, d = _replay(str(TRACES / "cupy-oom-frag.parquet"), "--sim", "cupy", "--capacity", "none")
    assert code == 0 and d["capacity"] is None and d["oom"] is None


def test_torch_snapshot_fails_where_pytorch_failed() -> None:
    # The snapshot's memory fraction allowed 15,038,676,992 bytes; PyTorch raised at seq 20175.
    code, d = _replay(str(TRACES / "torch-oom.parquet"), "--sim", "torch", "--fail-on-oom")
    assert code == 3
    assert d["capacity"] == 15_038_676_992 and d["oom"]["seq"] == 20175


def test_free_lists_stay_unbounded_by_default() -> None:
    code, d = _replay(str(TRACES / "cupy-oom-frag.parquet"), "--sim", "best-fit")
    assert code == 0 and d["capacity"] is None and d["oom"] is None


def test_replay_follows_the_program_to_the_oom_it_died_of() -> None:
    """ResNet-50 under 4.19 GiB (H200): 4 cuDNN workspace requests failed and were handled, the
    fifth OOM (seq 14274, step 7) ended the program. The replay fails the 4 again and goes on to
    it; --stop-at-first-oom stops at the first handled one."""
    path = str(TRACES / "torch-resnet-fraction.parquet")
    code, d = _replay(path, "--sim", "torch", "--as-recorded")
    assert code == 0 and d["oom"]["seq"] == 14274 and d["handled_oom_count"] == 4
    code, first = _replay(path, "--sim", "torch", "--as-recorded", "--stop-at-first-oom")
    assert first["oom"]["seq"] < 14274 and first["handled_oom_count"] == 0
    code, pred = _replay(path, "--sim", "torch")  # the prediction advise makes for the recorded setting
    assert code == 0 and pred["oom"]["seq"] == 14274


def test_as_recorded_applies_to_sim_only(tmp_path: Path) -> None:
    res = runner.invoke(app, ["replay", str(TRACES / "torch-oom.parquet"), "--device", "0", "--as-recorded"])
    assert res.exit_code == 2 and "--as-recorded applies to --sim" in res.stderr


def test_an_oom_in_a_pool_of_the_programs_own_is_said() -> None:
    """The real H100 recording whose own pool ran out at its own 48 MiB (``traces/fidelity/user-pool-limit``):
    the simulator holds every pool to one limit (the default pool's: none here), so it replays without
    the OOM; the note says why, and where that pool's question is answered."""
    trace = TRACES / "fidelity" / "user-pool-limit" / "user-pool-limit.parquet"
    res = runner.invoke(app, ["replay", str(trace), "--sim", "cupy", "--json"])
    assert res.exit_code == 0
    assert "the recorded out-of-memory errors were in pool(s) the program made itself (1)" in res.stderr
    assert json.loads(res.stdout)["oom"] is None
    plain = runner.invoke(app, ["replay", str(TRACES / "cupy-oom-frag.parquet"), "--sim", "cupy", "--json"])
    assert "pool(s) the program made itself" not in plain.stderr
