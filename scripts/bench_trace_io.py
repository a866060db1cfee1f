#!/usr/bin/env python3
"""Benchmark the trace format: ``tracekit synth`` and ``tracekit info`` on large traces.

Each command runs in a fresh process; the figure is wall time, CPU time (user +
system of the child) and its peak RSS. One untimed ``info`` run first puts the
compiled pairing pass into numba's cache, as after the first use on a machine.

    python3 scripts/bench_trace_io.py [--events 10000000] [--pattern random ...]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> tuple[float, float, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "tracekit", *args], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"tracekit {' '.join(args)} failed: {p.stderr.read().decode() if p.stderr else ''}")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024**2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pattern", nargs="+", default=["random", "training", "fragmenting"])
    a = ap.parse_args()
    print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
    print(f"{'command':<28}{'events':>12}{'wall s':>9}{'cpu s':>9}{'Mev/s':>8}{'RSS GiB':>9}{'MB':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for pattern in a.pattern:
            out = Path(tmp) / f"{pattern}.parquet"
            wall, cpu, rss = run("synth", "-p", pattern, "-n", str(a.events), "-o", str(out))
            mb = out.stat().st_size / 1e6
            print(f"{'synth ' + pattern:<28}{a.events:>12,}{wall:>9.2f}{cpu:>9.2f}"
                  f"{a.events / wall / 1e6:>8.2f}{rss:>9.2f}{mb:>7.0f}")
            run("info", str(out))
            wall, cpu, rss = run("info", str(out))
            print(f"{'info ' + pattern:<28}{a.events:>12,}{wall:>9.2f}{cpu:>9.2f}"
                  f"{a.events / wall / 1e6:>8.2f}{rss:>9.2f}{mb:>7.0f}")


if __name__ == "__main__":
    main()
