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
    assert "pools        0 'default' (device 0, no limit recorded): 8 events" in text
    assert "1 'user 1' (device 0, limit 48.00 MiB): 31 events" in text


def test_analyze_names_the_program_s_pool_whose_limit_ran_out() -> None:
    text = runner.invoke(app, ["analyze", str(TRACE)]).stdout
    assert ("would have taken the program's own pool 'user 1' (pool 1) to 50.00 MiB, over its pool limit "
            "of 48.00 MiB") in text


def test_a_trace_without_pools_is_refused_for_any_pool() -> None:
    other = TRACE.parents[2] / "torch-train.parquet"  # PyTorch: one caching allocator, no pool column
    res = runner.invoke(app, ["whatif", str(other), "--pool", "0"])
    assert res.exit_code == 1 and "no pools are marked there (no pool column" in res.stderr


# Hand-built traces with a worked answer each (MiB): rows (op, MiB, address, pool, device).
MiB, G = 1 << 20, 1 << 36
_BASE = [(2, 4, 0x1000000, 0, 0), (0, 4, 0x1000000, 0, 0)]  # the default pool's 4 MiB on device 0


def _hand(tmp: Path, name: str, rows: list[tuple[int, int, int, int, int]], pools: list[dict] | None,
          oom_pool: int, oom_device: int, null_pool: bool = False) -> Path:
    import numpy as np
    import pyarrow as pa

    from tracekit.trace import Events, Source, TraceMeta, write_trace

    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] * MiB for r in rows], np.uint64)
    ev = Events.build(op, size, addr=np.array([r[2] for r in rows], np.uint64), rounded=size,
                      device=np.array([r[4] for r in rows], np.int32))
    seq = len(rows) - 1
    extra: dict = {"device_id": 0, "ooms": [{"seq": seq, "device": oom_device, "size": rows[-1][1] * MiB,
                                             "rounded": rows[-1][1] * MiB, "pool_id": oom_pool}]}
    if pools is not None:
        extra["pools"] = pools
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=32 * MiB, extra=extra)
    pool = pa.nulls(len(rows)) if null_pool else np.array([r[3] for r in rows], np.uint16)
    return write_trace(tmp / name, meta, ev, {"pool": pool})


def test_a_pool_on_another_device_replays_on_its_own_device_under_its_own_limit(tmp_path: Path) -> None:
    """Device 1 has its default pool (1) and the program's pool 2 (limit 8 MiB) holding 4 + 2 MiB; a 4 MiB
    request there takes it to 10 MiB, over 8: it fails. A pool id counts (pool, device) pairs, so the
    pool's rows are one device's, and the trace of two devices is replayed for it."""
    rows = [*_BASE, (2, 4, G, 1, 1), (0, 4, G, 1, 1), (2, 4, 2 * G, 2, 1), (0, 4, 2 * G, 2, 1),
            (2, 2, 2 * G + 8 * MiB, 2, 1), (0, 2, 2 * G + 8 * MiB, 2, 1), (4, 4, 0, 2, 1)]
    pools = [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": 0},
             {"id": 1, "device": 1, "kind": "pool", "label": "default", "limit_bytes": 64 * MiB},
             {"id": 2, "device": 1, "kind": "pool", "label": "user 1", "limit_bytes": 8 * MiB}]
    path = _hand(tmp_path, "two.parquet", rows, pools, 2, 1)
    code, d, err = _json("replay", str(path), "--sim", "cupy", "--pool", "2")
    assert code == 0 and d["capacity"] == 8 * MiB and d["oom"]["seq"] == 8, err
    code, d, _ = _json("replay", str(path), "--sim", "cupy", "--pool", "1")  # device 1's default pool
    assert code == 0 and d["capacity"] == 64 * MiB and d["oom"] is None
    text = runner.invoke(app, ["analyze", str(path)]).stdout
    # not measured at the OOM: the pool's own segment rows (6 MiB) and the request, not device 1's 10 MiB
    assert "would have taken the program's own pool 'user 1' (pool 2) to 10.00 MiB" in text


def test_without_pools_entries_only_pool_0_has_the_recorded_limit(tmp_path: Path) -> None:
    rows = [*_BASE, (2, 4, G, 1, 0), (0, 4, G, 1, 0), (4, 4, 0, 1, 0)]
    path = _hand(tmp_path, "bare.parquet", rows, None, 1, 0)
    code, d, _ = _json("info", str(path))
    assert [(p["id"], p["limit_bytes"]) for p in d["pools"]] == [(0, 32 * MiB), (1, None)]
    code, d, err = _json("replay", str(path), "--sim", "cupy", "--pool", "1")
    assert code == 0 and d["capacity"] is None and "recorded limit" not in err


def test_a_null_pool_column_marks_no_pools_for_info_and_for_pool(tmp_path: Path) -> None:
    rows = [*_BASE, (2, 4, G, 1, 0), (0, 4, G, 1, 0), (4, 4, 0, 1, 0)]
    path = _hand(tmp_path, "null.parquet", rows, None, 1, 0, null_pool=True)
    assert _json("info", str(path))[1]["pools"] == []
    res = runner.invoke(app, ["replay", str(path), "--sim", "cupy", "--pool", "0"])
    assert res.exit_code == 1 and "no pools are marked there" in res.stderr


def test_a_pool_without_events_says_nothing_before_its_refusal(tmp_path: Path) -> None:
    """Pool 5 is listed (with a 1 MiB limit) but has no rows: no note of its limit comes first."""
    rows = [*_BASE, (2, 4, G, 1, 0), (0, 4, G, 1, 0), (4, 4, 0, 1, 0)]
    pools = [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": 0},
             {"id": 1, "device": 0, "kind": "pool", "label": "user 1", "limit_bytes": 8 * MiB},
             {"id": 5, "device": 0, "kind": "pool", "label": "user 2", "limit_bytes": MiB}]
    path = _hand(tmp_path, "listed.parquet", rows, pools, 1, 0)
    res = runner.invoke(app, ["replay", str(path), "--sim", "cupy", "--pool", "5"])
    assert res.exit_code == 1 and "note" not in res.stderr
    assert "pool 5 has no events there; its pools: 0 ('default'), 1 ('user 1')" in res.stderr


def test_a_replay_written_with_one_pool_marks_no_pools(tmp_path: Path) -> None:
    """Every row of a replay went through the one simulated allocator (its own segment rows included):
    the output carries no pool column, so no pool of it can be taken for the recording's."""
    out = tmp_path / "o.parquet"
    res = runner.invoke(app, ["replay", str(TRACE), "--sim", "cupy", "--pool", "1", "-o", str(out)])
    assert res.exit_code == 0, res.stderr
    d = _json("info", str(out))[1]
    assert d["pools"] == [] and "pool" not in d["extra_columns"]
