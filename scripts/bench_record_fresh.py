"""Recording overhead as the issue measures it: ``bench_record_overhead.py`` in N fresh processes one
after another (each interleaving its variants over its repeats), every repeat of every variant pooled.

Reported per variant: the pooled minimum and median seconds and their ratios to CuPy's no-op hook
(pooled minimum to pooled minimum, pooled median to pooled median), each process's own ratio of
minima (the machine's speed drifts between processes, so a ratio measured side by side is the
sharper figure; their median is reported too), and the cost per allocation event in µs over the no-op
hook (pooled minimum, divided by the events of one timed run).

    PYTHONPATH=. python3 scripts/bench_record_fresh.py [--processes 5] [--steps 1500] [--repeats 3] --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
NOOP = "noop_hook"


def _over(runs: list[dict], key: str) -> dict[str, float]:  # type: ignore[type-arg]
    """The median over the processes of each variant's ``key`` figure ({} where no process had it)."""
    got = [r[key] for r in runs if r.get(key)]
    return {v: statistics.median([g[v] for g in got]) for v in got[0]} if got else {}


def summary(runs: list[dict], args: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    """The figures of the processes run so far (written after each one: a run cut short keeps them)."""
    variants = list(runs[0]["seconds_all"])
    pooled = {v: [s for r in runs for s in r["seconds_all"][v]] for v in variants}
    lo = {v: min(s) for v, s in pooled.items()}
    mid = {v: statistics.median(s) for v, s in pooled.items()}
    per_process = {v: [r["ratio_to_noop"][v] for r in runs] for v in variants}
    # every repeat's ratio to the no-op hook of the same repeat, pooled over the processes
    paired = {v: [x for r in runs for x in r.get("paired_to_noop", {}).get(v, [])] for v in variants}
    events = runs[0]["events_per_run"]
    # one timed run is steps/(steps + warmup) of the recorded events (the warm-up is recorded too)
    timed_events = {v: n * args.steps / (args.steps + runs[0]["warmup"]) for v, n in events.items()}
    result = {
        "machine": runs[0]["machine"], "gpu": runs[0]["gpu"], "cupy": runs[0]["cupy"],
        "python": runs[0]["python"], "date_utc": runs[0]["date_utc"],
        "processes": args.processes, "steps": args.steps, "repeats": args.repeats,
        "seconds_min": lo, "seconds_median": mid,
        "min_to_noop": {v: lo[v] / lo[NOOP] for v in variants},
        "median_to_noop": {v: mid[v] / mid[NOOP] for v in variants},
        "per_process_min_to_noop": per_process,
        "median_of_per_process": {v: statistics.median(r) for v, r in per_process.items()},
        "paired_median_to_noop": {v: statistics.median(x) for v, x in paired.items() if x},
        "paired_quartiles_to_noop": {v: statistics.quantiles(x, n=4)
                                     for v, x in paired.items() if len(x) > 1},
        "events_per_timed_run": timed_events,
        "us_per_event_over_noop": {v: (lo[v] - lo[NOOP]) / n * 1e6 for v, n in timed_events.items()},
        "blocking_sync": args.blocking_sync,
        # the timed thread's CPU (its host work where waits sleep): paired with the no-op hook of the
        # same repeat, pooled; and its µs per event over the no-op hook (median of each process's)
        "paired_thread_cpu_median_to_noop": {
            v: statistics.median([x for r in runs for x in r["paired_thread_cpu_to_noop"][v]])
            for v in variants},
        "thread_cpu_us_per_event_over_noop": {
            v: statistics.median([r["thread_cpu_us_per_event_over_noop"][v] for r in runs])
            for v in timed_events},
        "other_threads_cpu_median": {
            v: statistics.median([r["other_threads_cpu_median"][v] for r in runs]) for v in variants},
        # the timed thread's user-space instructions and cycles (where the host gives the counters):
        # per event over the no-op hook of the same repeat, and as a ratio, median over the processes
        "instructions_per_event_over_noop": _over(runs, "instructions_per_event_over_noop"),
        "cycles_per_event_over_noop": _over(runs, "cycles_per_event_over_noop"),
        "paired_instructions_to_noop": _over(runs, "paired_instructions_to_noop"),
        "paired_cycles_to_noop": _over(runs, "paired_cycles_to_noop"),
        "runs": runs,
    }
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=5)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--shuffle", action="store_true", help="each process runs its variants in a random order")
    ap.add_argument("--blocking-sync", action="store_true",
                    help="waits for the device sleep (bench_record_overhead.py --blocking-sync)")
    args = ap.parse_args()
    runs = []
    for i in range(args.processes):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [sys.executable, str(HERE / "bench_record_overhead.py"), "--steps", str(args.steps),
                   "--repeats", str(args.repeats), "--json", str(out)]
            if args.shuffle:
                cmd += ["--shuffle", str(i)]
            if args.blocking_sync:
                cmd += ["--blocking-sync"]
            subprocess.run(cmd, env=dict(os.environ), check=True, stdout=subprocess.DEVNULL)
            runs.append(json.loads(out.read_text()))
        print(f"process {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in runs[-1]["ratio_to_noop"].items()),
              flush=True)
        if args.json:
            args.json.write_text(json.dumps(summary(runs, args), indent=1))
    result = summary(runs, args)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    lo, mid = result["seconds_min"], result["seconds_median"]
    for v in lo:
        print(f"{v:16s} min {lo[v]:.3f}s median {mid[v]:.3f}s  min/noop {result['min_to_noop'][v]:.3f}"
              f"  median/noop {result['median_to_noop'][v]:.3f}"
              f"  paired median {result['paired_median_to_noop'].get(v, float('nan')):.3f}"
              f"  per-process median {result['median_of_per_process'][v]:.3f}"
              f"  thread CPU paired {result['paired_thread_cpu_median_to_noop'][v]:.3f}")
    for key in ("instructions_per_event_over_noop", "cycles_per_event_over_noop",
                "paired_instructions_to_noop", "paired_cycles_to_noop"):
        if result[key]:
            print(f"{key}:", {v: round(x, 3) for v, x in result[key].items()})
    print("thread CPU µs an event over the no-op hook:",
          {v: round(x, 3) for v, x in result["thread_cpu_us_per_event_over_noop"].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
