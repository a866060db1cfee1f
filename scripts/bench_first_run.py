#!/usr/bin/env python3
"""Every verb on every committed trace, twice, each in a fresh process: first run against second.

Target (issue: a compiled core): every verb on the committed traces within 2 s on a fresh install,
the first run as fast as the second (no kernel compiled at run time). Run it right after
``pip install -e .`` in a fresh clone, with that clone's interpreter:

    .venv/bin/python scripts/bench_first_run.py [--verbs info,analyze,...] [--out DIR]

Prints one row per verb: the slowest first and second run over the traces and which trace that
was, and the number of numba cache files written during the runs (0: nothing was compiled).
Verbs: info, analyze, replay (the trace's own allocator model and best-fit), whatif, advise,
report, import (the committed PyTorch snapshots) and fleet (all traces at once).
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
TRACES = sorted((ROOT / "traces").glob("*.parquet"))
SNAPSHOTS = sorted((ROOT / "traces").glob("*.pickle.gz"))


def commands(out: Path) -> dict[str, list[tuple[str, list[str]]]]:
    """Per verb, (trace name, arguments) of each run."""
    def model(p: Path) -> str:
        return "torch" if p.name.startswith("torch") else "cupy"

    runs: dict[str, list[tuple[str, list[str]]]] = {
        "info": [(p.name, ["info", str(p)]) for p in TRACES],
        "analyze": [(p.name, ["analyze", str(p)]) for p in TRACES],
        "replay": [(f"{p.name} {pol}", ["replay", str(p), "--sim", pol])
                   for p in TRACES for pol in (model(p), "best-fit")],
        "whatif": [(p.name, ["whatif", str(p)]) for p in TRACES],
        "advise": [(p.name, ["advise", str(p)]) for p in TRACES],
        "report": [(p.name, ["report", str(p), "-o", str(out / f"{p.stem}.html"), "--force"])
                   for p in TRACES],
        "import": [(p.name, ["import", "torch", str(p), "-o", str(out / f"{p.name}.parquet"), "--force"])
                   for p in SNAPSHOTS],
        "fleet": [("all", ["fleet", *map(str, TRACES), "-o", str(out / "fleet.json"), "--force"])],
    }
    return runs


def cache_files(since: float) -> int:
    """numba cache files (index or data) under the package written after ``since``."""
    n = 0
    for p in (ROOT / "tracekit").rglob("*.nb[ic]"):
        if p.stat().st_mtime >= since:
            n += 1
    return n


def timed(args: list[str]) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "tracekit", *args], cwd=ROOT,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, r.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--verbs", default=None, help="comma-separated subset of the verbs")
    ap.add_argument("--out", type=Path, default=None, help="folder for outputs (default: a temporary one)")
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="tracekit-first-run-"))
    out.mkdir(parents=True, exist_ok=True)
    runs = commands(out)
    verbs = a.verbs.split(",") if a.verbs else list(runs)
    print(f"machine: {platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.2f}")
    print(f"{'verb':<9}{'runs':>5}{'first max s':>13}{'second max s':>14}  {'slowest (first run)':<40}"
          f"{'cache writes':>13}{'failed':>8}")
    for verb in verbs:
        since = time.time()
        first: list[tuple[float, str]] = []
        second: list[float] = []
        failed = 0
        for name, args in runs[verb]:
            t1, rc1 = timed(args)
            t2, rc2 = timed(args)
            failed += (rc1 != 0) + (rc2 != 0)
            first.append((t1, name))
            second.append(t2)
        worst = max(first)
        print(f"{verb:<9}{len(first):>5}{worst[0]:>13.2f}{max(second):>14.2f}  {worst[1]:<40}"
              f"{cache_files(since):>13}{failed:>8}", flush=True)


if __name__ == "__main__":
    main()
