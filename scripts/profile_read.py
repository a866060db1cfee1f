#!/usr/bin/env python3
"""Where a process's first read of a trace goes (issue 45, "Read once, fast"): NumPy loaded as the
verbs load it, then one ``read_trace`` under cProfile, the top functions by cumulative and by own
time. The wall time of the read is printed first (cProfile adds a little to it).

    PYTHONPATH=. python3 scripts/profile_read.py TRACE [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from tracekit.numpy_setup import load_numpy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    load_numpy()
    from tracekit.trace.reader import read_trace

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    trace = read_trace(a.trace)
    prof.disable()
    print(f"first read {time.perf_counter() - t0:.3f} s, {len(trace.events):,} events")
    for key in ("cumulative", "tottime"):
        pstats.Stats(prof).sort_stats(key).print_stats(a.top)


if __name__ == "__main__":
    main()
