"""``advise --rerun``: the recorded program run again for real, over the CuPy stand-in on the CPU.

The program keeps 5 MiB live under ``record --limit 4MiB`` and dies of the OOM. advise says
nothing fits under 4 MiB and that a raised ``set_limit`` does; ``--rerun 2`` runs the program
again under that limit (it finishes) and under the recorded one (it fails at the same request),
each recorded into a new folder beside the trace, and says both agree with the prediction.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tracekit.trace import read_trace

ROOT = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).resolve().parents[1] / "fakecupy"

PROGRAM = """
    import cupy
    keep = [cupy.empty(1 << 20) for _ in range(5)]
    print("done", len(keep))
"""


def _tk(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FAKE}", "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "tracekit", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_rerun_runs_the_program_under_the_best_settings(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(PROGRAM))
    rec = _tk(tmp_path, "record", "--limit", "4MiB", "-o", "t.parquet", "app.py")
    assert rec.returncode == 1 and "OutOfMemoryError" in rec.stderr, rec.stderr
    meta = read_trace(tmp_path / "t.parquet").meta.extra["rerun"]
    assert meta == {"argv": ["app.py"], "module": False, "cwd": str(tmp_path), "limit_bytes": 4 << 20}

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # the reruns run in the recorded folder, wherever advise is asked from
    res = _tk(elsewhere, "advise", str(tmp_path / "t.parquet"), "--json", "--jobs", "1", "--rerun", "2")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    runs = {r["setting"]: r for r in d["reruns"]}
    raised = next(r for s, r in runs.items() if s.startswith("CuPy pool, set_limit"))
    assert raised["ran"] and raised["predicted"] == "fits"
    assert raised["finished"] and raised["exit_code"] == 0 and raised["got_past_failing_request"]
    assert raised["agrees"] is True and raised["real_ooms"] == 0
    assert raised["limit_held_bytes"] == raised["limit_asked_bytes"] and not raised["overridden"]
    assert raised["real_peak_reserved_bytes"] == 5 << 20  # five 1 MiB device allocations
    pool = runs["CuPy default pool"]
    assert pool["ran"] and not pool["finished"] and pool["got_past_failing_request"] is False
    assert pool["agrees"] is True and pool["exit_code"] == 1
    # Nothing that needs a program change fits here, so none is listed.
    assert all(r["ran"] for r in d["reruns"])
    folder = tmp_path / "t.rerun"
    assert sorted(p.name for p in folder.iterdir()) == ["rerun-1.log", "rerun-1.parquet", "rerun-2.log",
                                                        "rerun-2.parquet"]
    assert "done 5" in (folder / "rerun-1.log").read_text()

    # A second --rerun never touches the first one's files: it makes a folder of its own.
    text = _tk(elsewhere, "advise", str(tmp_path / "t.parquet"), "--jobs", "1", "--rerun", "1")
    assert text.returncode == 0 and "rerun: the recorded program run for real" in text.stdout
    assert (tmp_path / "t.rerun-1" / "rerun-1.parquet").exists()
    assert len(list(folder.iterdir())) == 4


def test_rerun_dir_that_exists_is_refused(tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(textwrap.dedent(PROGRAM))
    assert _tk(tmp_path, "record", "--limit", "4MiB", "-o", "t.parquet", "app.py").returncode == 1
    (tmp_path / "mine").mkdir()
    res = _tk(tmp_path, "advise", "t.parquet", "--rerun", "1", "--rerun-dir", "mine")
    assert res.returncode == 2 and "already exists" in res.stderr and "Traceback" not in res.stderr


SIZED = """
    import sys
    import cupy
    keep = [cupy.empty(1 << 20) for _ in range(int(sys.argv[1]))]
"""


def test_past_the_failing_request_is_named_by_stack_size_and_ordinal(tmp_path: Path) -> None:
    from tracekit.advise.rerun import FailingRequest, past

    (tmp_path / "app.py").write_text(textwrap.dedent(SIZED))

    def recorded(name: str, n: int, limit: str) -> object:
        _tk(tmp_path, "record", "--limit", limit, "-o", name, "app.py", str(n))
        return read_trace(tmp_path / name)

    failing = FailingRequest.of(recorded("a.parquet", 5, "4MiB"))  # the 5th 1 MiB request fails
    assert failing is not None and failing.ordinal == 5 and failing.size == 1 << 20
    assert any(f.startswith("app.py:4:") for f in failing.frames)
    assert past(failing, recorded("same.parquet", 5, "4MiB")) is False
    assert past(failing, recorded("later.parquet", 7, "6MiB")) is True  # its 5th was served; the 7th failed
    assert past(failing, recorded("sooner.parquet", 3, "2MiB")) is False  # died before making it
    assert past(failing, recorded("fits.parquet", 5, "8MiB")) is True
    assert past(None, read_trace(tmp_path / "fits.parquet")) is None  # nothing failed: nothing to get past


OWN_LIMIT = """
    import cupy
    cupy.get_default_memory_pool().set_limit(size=4 << 20)  # whatever record's --limit said
    keep = [cupy.empty(1 << 20) for _ in range(5)]
    print("done", len(keep))
"""


def test_a_rerun_the_program_held_to_its_own_limit_claims_nothing(tmp_path: Path) -> None:
    """The program sets its own limit whatever ``record --limit`` set: the rerun of a raised ``set_limit``
    runs under the program's limit, not the setting's. It is said so, and neither agrees nor disagrees."""
    (tmp_path / "app.py").write_text(textwrap.dedent(OWN_LIMIT))
    rec = _tk(tmp_path, "record", "-o", "t.parquet", "app.py")
    assert rec.returncode == 1 and "OutOfMemoryError" in rec.stderr, rec.stderr
    res = _tk(tmp_path, "advise", "t.parquet", "--json", "--jobs", "1", "--rerun", "1")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["limit_bytes"] == 4 << 20  # the program's own, not the device's
    (raised,) = [r for r in d["reruns"] if r["setting"].startswith("CuPy pool, set_limit")]
    assert raised["ran"] and raised["limit_asked_bytes"] > 4 << 20 and raised["limit_held_bytes"] == 4 << 20
    assert raised["overridden"] and raised["agrees"] is None and not raised["finished"]
    assert "the program set a limit of its own (4194304 bytes) over record's --limit" in raised["note"]
    text = _tk(tmp_path, "advise", "t.parquet", "--jobs", "1", "--rerun", "1", "--rerun-dir", "again")
    assert "(not run under it)" in text.stdout, text.stdout


def test_a_setting_of_the_programs_own_pool_is_not_rerun(tmp_path: Path) -> None:
    """advise answered for a pool the program made itself (a real H100 recording,
    ``traces/fidelity/user-pool-limit``): ``record --limit`` sets the default pool's limit alone, so a
    rerun would run under the recorded limit of that pool and fail where the recording did. Nothing is
    run, each setting says why, and no folder is made."""
    trace = tmp_path / "t.parquet"
    trace.write_bytes((ROOT / "traces" / "fidelity" / "user-pool-limit" / "user-pool-limit.parquet")
                      .read_bytes())
    res = _tk(tmp_path, "advise", "t.parquet", "--json", "--jobs", "1", "--rerun", "2")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["pool"]["id"] == 1 and len(d["reruns"]) == 2
    for r in d["reruns"]:
        assert not r["ran"] and r["agrees"] is None
        assert "the program's own pool 'user 1' (pool 1 on device 0)" in r["note"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.parquet"]


BESIDE_USER_POOL = """
    import cupy
    MiB = 1 << 20
    pool = cupy.cuda.MemoryPool()
    with cupy.cuda.using_allocator(pool.malloc):
        user_held = [cupy.cuda.alloc(8 * MiB) for _ in range(4)]
    held = [cupy.cuda.alloc((6 + i) * MiB) for i in range(8)]
    print("done", len(held), len(user_held))
"""


def test_the_default_pools_limit_holds_its_own_rows(tmp_path: Path) -> None:
    """A pool of the program's own holds 32 MiB; the default pool, under ``record --limit 64MiB``, takes 6,
    7, ..., 13 MiB: its 13 MiB request fails (63 + 13 > 64). CuPy's ``set_limit`` holds the default pool's
    own bytes alone, so advise names 76 MiB (not 76 + 32), and the program run again under advise's raised
    limit finishes (the stand-in keeps a limit per pool, as CuPy does)."""
    (tmp_path / "app.py").write_text(textwrap.dedent(BESIDE_USER_POOL))
    rec = _tk(tmp_path, "record", "--limit", "64MiB", "-o", "t.parquet", "app.py")
    assert rec.returncode == 1 and "allocating 13,631,488 bytes" in rec.stderr, rec.stderr
    res = _tk(tmp_path, "advise", "t.parquet", "--json", "--jobs", "1", "--rerun", "1")
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert "pool" not in d and d["limit_bytes"] == 64 << 20
    assert d["lower_bound_bytes"] == d["min_capacity_bytes"] == 76 << 20
    (raised,) = [r for r in d["reruns"] if r["setting"].startswith("CuPy pool, set_limit")]
    assert raised["ran"] and raised["finished"] and raised["agrees"] is True
    assert raised["limit_asked_bytes"] < (76 + 32) << 20
    # its peak is the default pool's, as the prediction's is (the user pool's 32 MiB are not counted)
    assert raised["real_peak_reserved_bytes"] == raised["predicted_peak_reserved_bytes"], raised
