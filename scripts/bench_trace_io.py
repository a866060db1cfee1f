#!/usr/bin/env python3
"""Benchmark the trace format: ``tracekit synth`` and ``tracekit info`` on large traces; or the read.

Each command runs in a fresh process; the figure is wall time, CPU time (user +
system of the child) and its peak RSS. One untimed ``info`` run first puts the
compiled pairing pass into numba's cache, as after the first use on a machine.

``--read TRACE``: the read alone (issue 45, "Read once, fast": at most 1.0 s for 10M events on the
2-core machine). Each run is a fresh process that imports the reader, then times ``read_trace``
twice: the first read (numba loading the reader's compiled pass from its cache included) and a
second one, with the peak RSS of the process. ``--against DIR``: the same runs, interleaved, with
the tracekit of another checkout (the code before a change); min and median of ``--runs``.
``--pass-ab``: the same runs, interleaved, with the reader's pass in numba
(``TRACEKIT_READ_PASS=numba``) beside the C pass this tree was built with (``tracekit.trace.readpass``).
``--copy-ab``: the same runs, interleaved, with the integer columns copied on the reading thread
(``tracekit.trace.columns._copiers`` 0) beside the copies in parallel. ``--switch-ab``: the same
runs with Python's 5 ms GIL switch interval through the read (``reader.READ_SWITCH_S``) beside.

    python3 scripts/bench_trace_io.py [--events 10000000] [--pattern random ...]
    python3 scripts/bench_trace_io.py --read /tmp/r10m.parquet [--against /tmp/base] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
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


READ = """
import resource, sys, time
try:
    from tracekit.numpy_setup import load_numpy  # NumPy as the verbs load it
except ImportError:  # a tree from before it
    load_numpy = lambda: None
load_numpy()
import os
from tracekit.trace.reader import read_trace
if os.environ.get("BENCH_COPIES_ON_READER"):  # --copy-ab: the columns copied on the reading thread
    from tracekit.trace import columns
    columns._copiers = lambda n: 0
if os.environ.get("BENCH_DEFAULT_SWITCH"):  # --switch-ab: Python's own switch interval through the read
    from tracekit.trace import reader
    reader.READ_SWITCH_S = 0.005
t0 = time.perf_counter(); read_trace(sys.argv[1]); t1 = time.perf_counter(); read_trace(sys.argv[1])
t2 = time.perf_counter()
print(t1 - t0, t2 - t1, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2)
"""


def read_once(tree: Path, trace: str, env: dict[str, str]) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree), **env}
    out = subprocess.run([sys.executable, "-c", READ, trace], cwd=tree, env=env, capture_output=True,
                         text=True, check=True)
    return [float(x) for x in out.stdout.split()]


def reads(trace: str, against: Path | None, runs: int, pass_ab: bool = False, copy_ab: bool = False,
          switch_ab: bool = False) -> None:
    trees: dict[str, tuple[Path, dict[str, str]]] = {"this tree": (ROOT, {})}
    if against:
        trees[f"against {against}"] = (against, {})
    if pass_ab:
        trees["this tree, the numba pass"] = (ROOT, {"TRACEKIT_READ_PASS": "numba"})
    if copy_ab:
        trees["this tree, copies on the reading thread"] = (ROOT, {"BENCH_COPIES_ON_READER": "1"})
    if switch_ab:
        trees["this tree, switch interval 5 ms"] = (ROOT, {"BENCH_DEFAULT_SWITCH": "1"})
    for tree, env in trees.values():
        read_once(tree, trace, env)  # the kernels into numba's cache for that tree
    got: dict[str, list[list[float]]] = {name: [] for name in trees}
    for _ in range(runs):
        for name, (tree, env) in trees.items():
            got[name].append(read_once(tree, trace, env))
    head = f"{'read ' + Path(trace).name:<40}{'first s':>9}{'(med)':>7}{'second s':>10}{'(med)':>7}"
    print(f"{head}{'RSS GiB':>9}")
    for name, rows in got.items():
        first, second, rss = zip(*rows, strict=True)
        print(f"{name:<40}{min(first):>9.3f}{statistics.median(first):>7.3f}{min(second):>10.3f}"
              f"{statistics.median(second):>7.3f}{max(rss):>9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pattern", nargs="+", default=["random", "training", "fragmenting"])
    ap.add_argument("--read", metavar="TRACE", help="time the read of TRACE alone (see above)")
    ap.add_argument("--against", type=Path, default=None, help="with --read: another checkout, interleaved")
    ap.add_argument("--pass-ab", action="store_true", help="with --read: numba's pass beside, interleaved")
    ap.add_argument("--copy-ab", action="store_true",
                    help="with --read: the columns copied on the reading thread beside, interleaved")
    ap.add_argument("--switch-ab", action="store_true",
                    help="with --read: Python's own GIL switch interval through the read beside, interleaved")
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    if a.read:
        print(f"# {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
        reads(a.read, a.against, a.runs, a.pass_ab, a.copy_ab, a.switch_ab)
        return
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
