"""Benchmark the matplotlib figures (``report --png``) on a large synthetic trace: stage times, peak memory.

Usage: ``python3 scripts/bench_report.py [--events 10000000] [--pattern fragmenting] [--keep DIR]
[--trace PATH]`` (``--trace`` benchmarks an existing trace, e.g. a replay with segment rows).
Writes the trace (unless it exists in ``--keep``), then times reading, the
analyzer, figure building and writing the PNGs separately, and prints one
line per stage plus the total and the peak resident memory of the process.
Target: under 30 s for 10 million events on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pattern", default="fragmenting")
    ap.add_argument("--keep", type=Path, default=None, help="folder for the trace and the report")
    ap.add_argument("--trace", type=Path, default=None, help="an existing trace to use instead")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tracekit-bench-report-"))
    folder.mkdir(parents=True, exist_ok=True)
    trace = args.trace or folder / f"{args.pattern}-{args.events}.parquet"
    if not trace.exists():
        from tracekit.synth import Pattern, synthesize

        t = time.perf_counter()
        synthesize(Pattern(args.pattern), args.events, 0, trace)
        print(f"synth     {time.perf_counter() - t:7.2f} s  ({args.events:,} events, not counted)")

    from tracekit.analysis import analyze_trace
    from tracekit.outputs import write_bytes
    from tracekit.report.build import build_figures
    from tracekit.trace import read_trace

    # Warm numba caches so the figure is steady-state (compilation is cached on disk after a first run).
    small = folder / "warm.parquet"
    if not small.exists():
        from tracekit.synth import Pattern, synthesize

        synthesize(Pattern(args.pattern), 20_000, 0, small)
    build_figures(read_trace(small), None, "warm")

    c0 = time.process_time()
    t0 = time.perf_counter()
    tr = read_trace(trace)
    t1 = time.perf_counter()
    an = analyze_trace(tr, timeline=True)
    t2 = time.perf_counter()
    rendered, _, _ = build_figures(tr, an, trace.name)
    t3 = time.perf_counter()
    out = folder / "png"  # the figures as `report --png` writes them
    out.mkdir(exist_ok=True)
    for r in rendered:
        write_bytes(out / f"{r.key}.png", r.png)
    t4 = time.perf_counter()
    cpu = time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"read      {t1 - t0:7.2f} s")
    print(f"analyze   {t2 - t1:7.2f} s")
    print(f"figures   {t3 - t2:7.2f} s")
    size = sum(f.stat().st_size for f in out.iterdir())
    print(f"png       {t4 - t3:7.2f} s  ({size / 1024:.0f} KiB in {len(rendered)} files)")
    print(f"total     {t4 - t0:7.2f} s  for {len(tr.events):,} events; peak RSS {peak:.2f} GiB")
    # CPU seconds of this process: the figure to compare when other work shares the machine.
    print(f"cpu       {cpu:7.2f} s  (user + system, all threads); load average {_load()}")


def _load() -> str:
    import os

    return " ".join(f"{x:.1f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
