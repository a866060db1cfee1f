#!/usr/bin/env python3
"""What numba's first use costs a verb's process before any kernel runs: ``import numba``, the scan of
every installed package's entry points for ``numba_extensions`` (numba runs it when its CPU target
is first made, for a kernel loaded from the cache too), the extensions it finds and loads, and then
the reader's compiled pass loaded from the cache. Each in a fresh process (``--runs``), min and
median, with the modules each step added.

    PYTHONPATH=. python3 scripts/probe_numba_init.py [--runs 5]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

ONE = r"""
import json, sys, time
from importlib import metadata
from tracekit.numpy_setup import load_numpy
load_numpy()
from tracekit.trace import reader  # as a verb has it before its first read
m0 = len(sys.modules); t0 = time.perf_counter()
import collections
eps = [f"{e.name} = {e.value} ({e.dist.name if e.dist else '?'})"
       for e in metadata.entry_points().select(group="numba_extensions")]
t1 = time.perf_counter()
import numba
m2 = len(sys.modules); t2 = time.perf_counter()
from numba.core import entrypoints
entrypoints.init_all()
m3 = len(sys.modules); t3 = time.perf_counter()
before = set(sys.modules)
th = reader._load_pass(); th.join()
m4 = len(sys.modules); t4 = time.perf_counter()
added = collections.Counter(".".join(m.split(".")[:2]) for m in set(sys.modules) - before)
print(json.dumps({"entry_points": eps, "scan_s": t1 - t0, "import_numba_s": t2 - t1,
                  "init_all_s": t3 - t2, "load_pass_s": t4 - t3,
                  "modules": {"numba": m2 - m0, "init_all": m3 - m2, "load_pass": m4 - m3},
                  "dists": len(list(metadata.distributions())),
                  "load_pass_packages": dict(added.most_common(25))}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    runs = []
    for _ in range(args.runs):
        p = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True, check=True)
        runs.append(json.loads(p.stdout))
    keys = ("scan_s", "import_numba_s", "init_all_s", "load_pass_s")
    out = {k: {"min": min(r[k] for r in runs), "median": statistics.median(r[k] for r in runs)} for k in keys}
    # where the pass's load spends its time: -X importtime of one more process, the slowest imports
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", ONE], capture_output=True, text=True,
                       check=True)
    rows = [line.split("|") for line in p.stderr.splitlines() if line.startswith("import time:")][1:]
    slow = sorted(((int(r[1]), r[2].rstrip()) for r in rows if len(r) == 3 and r[1].strip().isdigit()),
                  reverse=True)[:25]
    print(json.dumps({"python": sys.version.split()[0], "entry_points": runs[0]["entry_points"],
                      "dists": runs[0]["dists"], "modules": runs[0]["modules"],
                      "load_pass_packages": runs[0]["load_pass_packages"], **out,
                      "slowest_imports_cumulative_us": slow}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
