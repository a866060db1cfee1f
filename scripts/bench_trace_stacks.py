#!/usr/bin/env python3
"""What whole stacks cost a large trace: file size and ``tracekit analyze`` time, with and without.

For each pattern, ``tracekit synth`` writes the same events twice (one seed): with ``--stacks 0``
(the call-sites alone, one-frame stacks: the trace as before format 3) and with ``--stacks N``
(N distinct whole stacks of 12 to 47 frames, the default 3000). Each ``tracekit analyze`` runs in
a fresh process, once untimed (numba's cache), then ``--repeats`` times; the figure is the minimum
wall time (and the CPU time and peak RSS of that run). Targets: size at most 1.3x, analyze at most
1.2x (docs/performance.md).

    PYTHONPATH=. python3 scripts/bench_trace_stacks.py [--events 10000000] [--pattern random ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trace_io import run  # the one child-process timer of the trace benchmarks


def measure(pattern: str, events: int, stacks: int, repeats: int, tmp: Path) -> dict[str, float]:
    out = tmp / f"{pattern}-{stacks}.parquet"
    synth_s, _, _ = run("synth", "-p", pattern, "-n", str(events), "--stacks", str(stacks), "-o", str(out),
                        "--force")
    run("analyze", str(out))  # numba's cache, as after a first use
    wall, cpu, rss = min(run("analyze", str(out)) for _ in range(repeats))
    size = out.stat().st_size
    out.unlink()
    return {"bytes": size, "synth_s": round(synth_s, 2), "analyze_s": round(wall, 2),
            "analyze_cpu_s": round(cpu, 2), "analyze_rss_gib": round(rss, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pattern", nargs="+", default=["random", "training", "fragmenting"])
    ap.add_argument("--stacks", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result: dict[str, object] = {"machine": platform.node(), "python": platform.python_version(),
                                 "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                                 "events": args.events, "stacks": args.stacks, "patterns": {}}
    with tempfile.TemporaryDirectory(prefix="tk-stacks-") as d:
        for pattern in args.pattern:
            before = measure(pattern, args.events, 0, args.repeats, Path(d))
            after = measure(pattern, args.events, args.stacks, args.repeats, Path(d))
            row = {"one_frame": before, "stacks": after,
                   "size_ratio": round(after["bytes"] / before["bytes"], 3),
                   "analyze_ratio": round(after["analyze_s"] / before["analyze_s"], 3)}
            result["patterns"][pattern] = row  # type: ignore[index]
            mib = (before["bytes"] / 2**20, after["bytes"] / 2**20)
            print(f"{pattern:12} size {mib[0]:7.1f} -> {mib[1]:7.1f} MiB (x{row['size_ratio']:.3f}); analyze "
                  f"{before['analyze_s']:.2f} -> {after['analyze_s']:.2f} s (x{row['analyze_ratio']:.3f})",
                  flush=True)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
