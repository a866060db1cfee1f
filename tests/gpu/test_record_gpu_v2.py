"""Version-2 recording on a real GPU: the device measured at the OOM, every pool, an independent hook.

Each program is recorded through the command line in a subprocess and writes
what it saw itself (``--witness``/``--probe`` JSON): a second
``cupy.cuda.MemoryHook`` registered beside the recorder, the blocks it made
from the async pool (which fires no hook), each pool's own counters and
``cudaMemGetInfo`` right at the raise. The trace must agree with all of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracekit.trace import Op, Trace, read_trace

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
POOLS = ROOT / "scripts" / "pool_workloads.py"
SEED = ROOT / "scripts" / "seed_scenario.py"
MiB = 1 << 20


def _record(tmp: Path, name: str, args: list[str]) -> tuple[subprocess.CompletedProcess[str], Trace]:
    out = tmp / f"{name}.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "tracekit", "record", "-o", str(out), *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert out.exists(), p.stderr
    keep = os.environ.get("TRACEKIT_GPU_OUT")
    if keep:  # the GPU script keeps the traces these tests make
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(out, Path(keep) / out.name)
    return p, read_trace(out, strict=True)


def _rows(t: Trace, pool: int | None = None, ops: tuple[Op, ...] = (Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC)
          ) -> list[list[Any]]:
    ev = t.events
    assert t.extras is not None
    pools = np.array(t.extras.column("pool").to_pylist(), dtype=object)
    keep = np.isin(ev.op, [int(o) for o in ops])
    if pool is not None:
        keep &= pools == pool
    out = []
    for i in np.flatnonzero(keep):
        size = ev.rounded[i] if ev.op[i] == Op.MALLOC else ev.size[i]
        out.append([Op(int(ev.op[i])).label, int(ev.addr[i]), int(size)])
    return out


def _live(t: Trace, pool: int, op: Op, upto: int | None = None) -> int:
    ev = t.events
    assert t.extras is not None
    pools = np.array(t.extras.column("pool").to_pylist(), dtype=object)
    n = len(ev) if upto is None else upto
    idx = np.arange(len(ev))
    live = (ev.op == op) & (pools == pool) & (idx < n) & ((t.mate < 0) | (t.mate >= n))
    col = ev.rounded if op == Op.MALLOC else ev.size
    return int(col[live].sum())


def test_user_pool_every_event_seen_by_an_independent_hook_and_the_pools_counters(tmp_path: Path) -> None:
    wit = tmp_path / "w.json"
    p, t = _record(tmp_path, "cupy-user-pool", [str(POOLS), "user_pool", "--witness", str(wit)])
    assert p.returncode == 0, p.stderr
    seen = json.loads(wit.read_text())
    pools = t.meta.extra["pools"]
    user = [e["id"] for e in pools if e["label"] == "user 1"]
    assert len(user) == 1 and pools[0]["label"] == "default"
    mine = _rows(t)
    assert mine[: len(seen["events"])] == seen["events"]  # every event equal, in order
    assert {e[0] for e in seen["events"]} == {"malloc", "free", "segment_alloc"}
    # the pool's own counters when the program printed them: before free_all_blocks on half the streams
    counted = seen["pools"][0]
    shown = np.flatnonzero(np.isin(t.events.op, [Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC]))
    at = int(shown[counted["events_seen"] - 1]) + 1  # the row after the last one the witness had seen
    assert not np.any(t.events.op[:at] == Op.SEGMENT_FREE)
    assert _live(t, user[0], Op.SEGMENT_ALLOC, at) == counted["total_bytes"]
    assert _live(t, user[0], Op.MALLOC, at) == counted["used_bytes"]
    # free_all_blocks fires no hook: the recorder found the segments it freed (by the end at the latest)
    ends = int(np.sum((t.events.op == Op.SEGMENT_FREE) & (np.array(t.extras.column("pool").to_pylist())
                                                          == user[0])))
    assert ends > 0 and _live(t, user[0], Op.SEGMENT_ALLOC) == counted["after_free"]["total_bytes"]
    assert counted["total_bytes"] > 100 * MiB  # the 62-allocation pool the old recorder missed
    dfree = t.extras.column("device_free").to_pylist()  # type: ignore[union-attr]
    seg = np.flatnonzero((t.events.op == Op.SEGMENT_ALLOC) | (t.events.op == Op.SEGMENT_FREE))
    assert all(dfree[i] is not None and dfree[i] > 0 for i in seg)
    assert len(np.unique(t.events.stream[t.events.op == Op.MALLOC])) >= 8


def test_async_pool_rows_match_what_the_program_made(tmp_path: Path) -> None:
    wit = tmp_path / "w.json"
    p, t = _record(tmp_path, "cupy-async", ["--async-pools", str(POOLS), "async", "--witness", str(wit)])
    assert p.returncode == 0, p.stderr
    seen = json.loads(wit.read_text())
    (pid,) = [e["id"] for e in t.meta.extra["pools"] if e["kind"] == "async"]
    ev = t.events
    assert t.extras is not None
    pools = np.array(t.extras.column("pool").to_pylist(), dtype=object)
    mallocs = [["malloc", int(ev.addr[i]), int(ev.size[i])]
               for i in np.flatnonzero((ev.op == Op.MALLOC) & (pools == pid))]
    frees = [int(ev.addr[i]) for i in np.flatnonzero((ev.op == Op.FREE) & (pools == pid))]
    assert mallocs == [e for e in seen["async"] if e[0] == "malloc"]
    want_frees = [e[1] for e in seen["async"] if e[0] == "free"]
    assert frees[: len(want_frees)] == want_frees
    dfree = t.extras.column("device_free").to_pylist()
    rows = np.flatnonzero(pools == pid)
    assert all(dfree[i] is not None for i in rows)  # every async row has the device measured
    assert not np.any(ev.op[rows] == Op.SEGMENT_ALLOC)


def test_pools_made_in_threads_are_kept_apart(tmp_path: Path) -> None:
    wit = tmp_path / "w.json"
    p, t = _record(tmp_path, "threads", [str(POOLS), "pool_threads", "--witness", str(wit)])
    assert p.returncode == 0, p.stderr
    seen = json.loads(wit.read_text())
    users = [e["id"] for e in t.meta.extra["pools"] if e["label"].startswith("user")]
    assert len(users) == 3
    for pid in users:
        assert len(_rows(t, pid, (Op.MALLOC,))) == 30
    peaks = sorted(max(_live(t, pid, Op.SEGMENT_ALLOC, k) for k in range(0, len(t.events) + 1, 7))
                   for pid in users)
    assert peaks == sorted(s["total_bytes"] for s in seen["pools"])


def test_the_measured_free_at_the_oom_is_memgetinfo_at_the_raise(tmp_path: Path) -> None:
    wit = tmp_path / "w.json"
    p, t = _record(tmp_path, "oom-probe", [str(POOLS), "oom_probe", "--witness", str(wit)])
    assert p.returncode == 1 and "OutOfMemoryError" in p.stderr
    seen = json.loads(wit.read_text())
    (state,) = t.meta.extra["oom_states"]
    assert abs(state["mem_free"] - seen["oom_free"]) <= 2 * MiB
    assert state["pool"]["used_bytes"] == seen["pools"][0]["used_bytes"]
    assert state["pool"]["limit_bytes"] == 64 * MiB
    assert t.meta.extra["exit"]["oom_seq"] == state["seq"] and t.events.op[state["seq"]] == Op.OOM
    assert t.meta.extra["exit"]["status"] == "exception"
    assert t.meta.extra["exit"]["exception"] == "cupy.cuda.memory.OutOfMemoryError"
    # NVML lists this process (under its own pid unless the container hides the host's pids)
    assert state["processes"] and all(pr["used_bytes"] is None or pr["used_bytes"] > 0
                                      for pr in state["processes"])
    assert t.meta.extra["device_mismatches"] == 0


def test_seed_scenario_names_the_other_process_and_the_stack_limit(tmp_path: Path) -> None:
    probe = tmp_path / "probe.json"
    p, t = _record(tmp_path, "cupy-seed", [str(SEED), "--probe", str(probe)])
    assert p.returncode == 1 and "OutOfMemoryError" in p.stderr, p.stderr
    seen = json.loads(probe.read_text())
    (state,) = t.meta.extra["oom_states"]
    assert abs(state["mem_free"] - seen["mem_free"]) <= 2 * MiB
    assert state["limits"]["stack_size"] == seen["stack_size"] >= 16384
    assert t.meta.extra["device_limits"]["stack_size"] < 16384  # before the kernel's launch
    # the helper holds most of the device (found by pid where NVML shows this namespace's pids)
    big = [pr for pr in state["processes"] if (pr["used_bytes"] or 0) > state["mem_total"] // 2]
    assert len(big) == 1 and not big[0]["self"]
    if any(pr["self"] for pr in state["processes"]):
        assert big[0]["pid"] == seen["helper_pid"]
    assert t.meta.extra["exit"]["oom_seq"] == state["seq"]
    # the call-site is stored relative to the working directory
    site = t.events.site_name(state["seq"])
    assert site is not None and site.startswith("scripts/seed_scenario.py:")


def test_sigterm_on_a_cupy_program_still_writes_the_whole_trace(tmp_path: Path) -> None:
    import signal
    import textwrap

    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent("""
        import time, cupy as cp
        keep = [cp.empty((i + 1) * 2**20, cp.uint8) for i in range(4)]
        cp.cuda.Device().synchronize()
        print("ready", flush=True)
        time.sleep(120)
    """))
    out = tmp_path / "stopped.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "tracekit", "record", "-o", str(out), str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGTERM, err  # it dies of it, as without tracekit
    t = read_trace(out, strict=True)  # written by the watcher, from the spool and its tail
    assert not Path(str(out) + ".spool").exists() and t.meta.extra["complete"] is False
    assert t.events.count(Op.MALLOC) == 4 and "signal" in t.meta.extra["ended"]
