#!/usr/bin/env python3
"""The libraries' own import floor under every verb, with and without one BLAS thread at load.

NumPy's bundled OpenBLAS starts its thread pool when the library is loaded, one thread per core
unless ``OPENBLAS_NUM_THREADS`` says otherwise; on a many-core host that start can be a large part
of ``import numpy``. Each figure is the minimum (median beside it) over ``--runs`` fresh processes,
the two settings interleaved, of a process's whole life (``python3 -c 'import ...'``).

    python3 scripts/probe_import_floor.py [--runs 7]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

STATEMENTS = {"pass": "pass", "numpy": "import numpy", "floor": "import numpy, pyarrow.parquet, typer"}


def once(stmt: str, one_thread: bool) -> float:
    env = dict(os.environ)
    env.pop("OPENBLAS_NUM_THREADS", None)
    if one_thread:
        env["OPENBLAS_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", stmt], env=env, check=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    got: dict[str, list[float]] = {}
    for _ in range(a.runs):
        for name, stmt in STATEMENTS.items():
            for one in (False, True):
                got.setdefault(f"{name}{' one BLAS thread' if one else ''}", []).append(once(stmt, one))
    out = {"cpus": os.cpu_count(), "python": platform.python_version(),
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
           "min_s": {k: round(min(v), 4) for k, v in got.items()},
           "median_s": {k: round(statistics.median(v), 4) for k, v in got.items()}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
