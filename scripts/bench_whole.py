"""Whole commands against the C++ reference process (issue 45 item 3), fresh processes interleaved.

The reference is ``scripts/bench_bestfit.cpp`` (best fit with ``std::set`` + ``std::map``, ``g++ -O2``)
run as a process that reads a flat binary of the trace's prepared requests and replays them; its
wall time, start to exit, is the bar. Against it, in the same rounds: ``tracekit replay TRACE --sim
best-fit --json`` and ``tracekit analyze TRACE --json``, each a fresh ``python -m tracekit`` process
(start-up, the Parquet read and its checks, the work, the output). Ratios as the issue states them:
replay's speed against the C++ process (C++ wall / replay wall, >= 1.0 is met) and analyze's time
against it (analyze wall / C++ wall, <= 0.8 is met), on the minimum of the rounds; medians beside;
each process's user and system CPU seconds beside its wall. After the rounds the replay runs again
``--runs`` times one right after another (``replay_back_to_back_*``): on a virtual machine whose
host takes back memory left free for a second or two, a process's first touch of memory costs more
after a process that touched little of it (system CPU shows it).

    PYTHONPATH=. python3 scripts/bench_whole.py [--events 10000000] [--runs 3] [--trace T] [--json OUT]

The trace is a ``tracekit synth --pattern random`` trace of ``--events`` events unless ``--trace``
names one. Both sides must agree on the peak of live bytes (checked).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _flat(trace: Path, data: Path) -> None:
    """The prepared requests as the C++ reference reads them: n, kind (int8), size, mate (int64)."""
    from tracekit.sim.prepare import prepare
    from tracekit.trace.reader import read_trace

    inp = prepare(read_trace(trace))
    with open(data, "wb") as f:
        for arr in (np.array([len(inp)], np.int64), inp.kind.astype(np.int8), inp.size, inp.mate):
            f.write(np.ascontiguousarray(arr).tobytes())


def _timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str, float, float]:
    """(wall s, stdout, user CPU s, system CPU s) of one process run to its end."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, p.stdout, after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    ap.add_argument("--head-start-ab", action="store_true",
                    help="also replay with the head start off (TRACEKIT_HEAD_START=0) and on (=1)")
    a = ap.parse_args()
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        print("no C++ compiler: nothing to compare against", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        trace = a.trace
        if trace is None:
            trace = tmp / "random.parquet"
            subprocess.run([sys.executable, "-m", "tracekit", "synth", "--pattern", "random", "--events",
                            str(a.events), "--seed", "1", "-o", str(trace)], check=True, capture_output=True)
        exe, data = tmp / "bench_bestfit", tmp / "requests.bin"
        src = ROOT / "scripts" / "bench_bestfit.cpp"
        subprocess.run([cxx, "-O2", "-std=c++17", "-o", str(exe), str(src)], check=True)
        _flat(trace, data)
        cmds = {
            "cpp": [str(exe), str(data)],
            "replay": [sys.executable, "-m", "tracekit", "replay", str(trace), "--sim", "best-fit", "--json"],
            "analyze": [sys.executable, "-m", "tracekit", "analyze", str(trace), "--json"],
        }
        envs: dict[str, dict[str, str]] = {}
        if a.head_start_ab:
            for name, on in (("replay_head_off", "0"), ("replay_head_on", "1")):
                cmds[name] = cmds["replay"]
                envs[name] = {**os.environ, "TRACEKIT_HEAD_START": on}
        for k, cmd in cmds.items():  # warm: the page cache, numba's cache
            subprocess.run(cmd, capture_output=True, check=True, env=envs.get(k))
        walls: dict[str, list[float]] = {k: [] for k in cmds}
        user: dict[str, list[float]] = {k: [] for k in cmds}
        system: dict[str, list[float]] = {k: [] for k in cmds}
        outs: dict[str, str] = {}
        for _ in range(a.runs):
            for k, cmd in cmds.items():
                w, outs[k], u, s = _timed(cmd, envs.get(k))
                walls[k].append(w)
                user[k].append(u)
                system[k].append(s)
        # The replay again, one right after another: the same process, only what ran before it differs
        # (in the rounds the C++ process, which touches a fifth of the memory, ran just before)
        again = [_timed(cmds["replay"]) for _ in range(a.runs)]
        cpp_peak = int(outs["cpp"].split()[1])
        ours_peak = int(json.loads(outs["replay"])["peak_live_bytes"])
        lo = {k: min(v) for k, v in walls.items()}
        med = {k: statistics.median(v) for k, v in walls.items()}
        res = {
            "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
            "python": platform.python_version(), "events": a.events if a.trace is None else None,
            "trace": str(trace.name), "runs": a.runs, "load_1min": round(os.getloadavg()[0], 2),
            "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "wall_s": {k: [round(x, 3) for x in v] for k, v in walls.items()},
            # system CPU: mostly first touches of fresh memory (page faults), which on a virtual
            # machine cost more where the host took the pages back meanwhile
            "user_s": {k: [round(x, 3) for x in v] for k, v in user.items()},
            "system_s": {k: [round(x, 3) for x in v] for k, v in system.items()},
            "replay_speed_vs_cpp_min": round(lo["cpp"] / lo["replay"], 3),
            "replay_speed_vs_cpp_median": round(med["cpp"] / med["replay"], 3),
            "analyze_time_vs_cpp_min": round(lo["analyze"] / lo["cpp"], 3),
            "analyze_time_vs_cpp_median": round(med["analyze"] / med["cpp"], 3),
            "same_peak_live": cpp_peak == ours_peak,
            "replay_back_to_back_s": [round(w, 3) for w, _, _, _ in again],
            "replay_back_to_back_system_s": [round(s, 3) for _, _, _, s in again],
            "replay_back_to_back_speed_vs_cpp_min": round(lo["cpp"] / min(w for w, _, _, _ in again), 3),
        }
        for k in ("replay_head_off", "replay_head_on"):
            if k in lo:
                res[f"{k}_speed_vs_cpp_min"] = round(lo["cpp"] / lo[k], 3)
                res[f"{k}_speed_vs_cpp_median"] = round(med["cpp"] / med[k], 3)
                res[f"{k}_same_output"] = outs[k] == outs["replay"]
    print(json.dumps(res, indent=1))
    if a.json is not None:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["same_peak_live"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
