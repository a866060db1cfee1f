"""``replay --pool`` and ``whatif --pool``: one CuPy pool's events alone, under that pool's own limit.

The fixture is a real recording (H100, ``scripts/pool_workloads.py user_pool_limit``): 64 MiB in the
default pool (pool 0, no limit), and a pool the program made (pool 1, ``set_limit(48 MiB)``) splintered
until a 24 MiB request failed at seq 38 with 24 MiB in use and 26 MiB reserved in that pool (CuPy:
"allocated so far: 27,262,976 bytes, limit set to: 50,331,648 bytes").
"""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from tracekit.cli.app import app

TRACE = Path(__file__).resolve().parents[2] / "traces" / "fidelity" / "user-pool-limit"
TRACE = TRACE / "user-pool-limit.parquet"
runner = CliRunner()


def _json(*args: str) -> tuple[int, dict, str]:
    res = runner.invoke(app, [*args, "--json"])
    return res.exit_code, json.loads(res.stdout) if res.stdout.strip() else {}, res.stderr


def test_replay_of_every_pool_under_one_limit_misses_the_recorded_oom_and_names_the_option() -> None:
    code, d, err = _json("replay", str(TRACE), "--sim", "cupy")
    assert code == 0 and d["oom"] is None  # the default pool has no limit: one limit for both lifts pool 1's
    assert "--pool 1 replays that pool alone" in err


def test_replay_of_the_program_s_pool_alone_fails_where_cupy_did() -> None:
    code, d, err = _json("replay", str(TRACE), "--sim", "cupy", "--pool", "1")
    assert code == 0
    assert d["capacity"] == 48 << 20  # the pool's own limit, not the default pool's (none)
    assert "replaying pool 1 alone under its recorded limit of 48.00 MiB" in err
    oom = d["oom"]
    assert oom["seq"] == 38 and oom["size"] == 24 << 20
    assert d["events"] < 39  # the pool's rows alone: the default pool's 4 mallocs are not replayed


def test_replay_of_one_pool_takes_a_capacity_given() -> None:
    code, d, _ = _json("replay", str(TRACE), "--sim", "cupy", "--pool", "1", "--capacity", "66MiB")
    assert code == 0 and d["capacity"] == 66 << 20 and d["oom"] is None  # advise's fit, the real run's too


def test_replay_of_the_default_pool_alone() -> None:
    code, d, _ = _json("replay", str(TRACE), "--sim", "cupy", "--pool", "0")
    # its 4 mallocs and 4 segments (8 rows of 39), no limit on it, nothing failed in it
    assert code == 0 and d["events"] == 8 and d["oom"] is None and d["capacity"] is None


def test_an_unknown_pool_is_one_sentence_listing_the_trace_s_pools() -> None:
    res = runner.invoke(app, ["replay", str(TRACE), "--sim", "cupy", "--pool", "7"])
    assert res.exit_code == 1  # bad input (tracekit.cli.app's exit codes)
    assert "pool 7 has no events there; its pools: 0 ('default'), 1 ('user 1')" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_pool_applies_to_sim_only() -> None:
    res = runner.invoke(app, ["replay", str(TRACE), "--device", "0", "--pool", "1"])
    assert res.exit_code == 2 and "--pool applies to --sim" in res.stderr


def test_whatif_of_one_pool_searches_its_rows_alone() -> None:
    code, whole, _ = _json("whatif", str(TRACE), "--policies", "best-fit")
    code1, one, _ = _json("whatif", str(TRACE), "--policies", "best-fit", "--pool", "1")
    assert code == code1 == 0
    # the bound is the pool's own peak of live bytes (the failing request counted live), not the run's
    assert one["lower_bound_bytes"] == 48 << 20
    assert whole["lower_bound_bytes"] > one["lower_bound_bytes"]
    fit = one["policies"][0]["min_capacity_bytes"]
    assert fit is not None and fit >= one["lower_bound_bytes"]


def test_info_lists_the_pools_with_their_limits_and_events() -> None:
    code, d, _ = _json("info", str(TRACE))
    assert code == 0
    assert [(p["id"], p["label"], p["limit_bytes"], p["events"]) for p in d["pools"]] == [
        (0, "default", None, 8), (1, "user 1", 48 << 20, 31)]
    assert d["extra_columns"] == ["pool", "device_free"]
    text = runner.invoke(app, ["info", str(TRACE)]).stdout
    assert "pools        0 'default' (device 0, no limit): 8 events" in text
    assert "1 'user 1' (device 0, limit 48.00 MiB): 31 events" in text


def test_analyze_names_the_program_s_pool_whose_limit_ran_out() -> None:
    text = runner.invoke(app, ["analyze", str(TRACE)]).stdout
    assert ("would have taken the program's own pool 'user 1' (pool 1) to 50.00 MiB, over its pool limit "
            "of 48.00 MiB") in text


def test_a_trace_without_pools_is_refused_for_any_pool() -> None:
    other = TRACE.parents[2] / "torch-train.parquet"  # PyTorch: one caching allocator, no pool column
    res = runner.invoke(app, ["whatif", str(other), "--pool", "0"])
    assert res.exit_code == 1 and "no pools are marked there (no pool column" in res.stderr
