"""Recording overhead on a CuPy MLP training loop: no hook, no-op hook, recording with/without sites.

Each variant runs a warm-up of the loop (untimed, so a fresh recorded pool
has its segments) and then the timed loop, ending with a device sync; the
variants are interleaved over the repeats (the machine's speed drifts) and
the minimum and median are reported, with their ratios to the run without
any hook, and the allocation events per second. The targets are judged on the
minimum, the usual estimator for a noisy machine.
Targets: recording with call-sites at most 1.15x, without at most 1.10x.

    PYTHONPATH=. python3 scripts/bench_record_overhead.py [--steps 200] [--repeats 21] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cupy as cp

from tracekit.record import CupyRecording
from tracekit.trace import read_trace

HERE = Path(__file__).resolve().parent


def _workloads():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("record_workloads", HERE / "record_workloads.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CPU: dict[str, list[float]] = {}


def timed(fn, steps: int, variant: str) -> float:  # type: ignore[no-untyped-def]
    """Wall seconds of ``fn(steps)`` to a device sync; process CPU seconds go to CPU[variant]."""
    cp.cuda.Device().synchronize()
    c0, t0 = time.process_time(), time.perf_counter()
    fn(steps)
    cp.cuda.Device().synchronize()
    wall = time.perf_counter() - t0
    CPU.setdefault(variant, []).append(time.process_time() - c0)
    return wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    mlp = _workloads().run_mlp
    tmp = Path(tempfile.mkdtemp(prefix="tk-bench-"))
    mlp(args.warmup)
    times: dict[str, list[float]] = {"none": [], "noop_hook": [], "record_no_sites": [], "record_sites": []}
    finalize_s: dict[str, list[float]] = {"record_no_sites": [], "record_sites": []}
    events: dict[str, int] = {}
    for rep in range(args.repeats):
        for variant in times:
            if variant == "none":
                mlp(args.warmup)
                times[variant].append(timed(mlp, args.steps, variant))
            elif variant == "noop_hook":
                with cp.cuda.MemoryHook():
                    mlp(args.warmup)
                    times[variant].append(timed(mlp, args.steps, variant))
            else:
                out = tmp / f"{variant}-{rep}.parquet"
                rec = CupyRecording(out, command=["bench"], sites=variant == "record_sites", force=True)
                rec.start()
                mlp(args.warmup)
                times[variant].append(timed(mlp, args.steps, variant))
                t0 = time.perf_counter()
                rec.stop({"code": 0}, restore=True)
                finalize_s[variant].append(time.perf_counter() - t0)
                events[variant] = len(read_trace(out, extras=False).events)
                out.unlink()
    base, mid = min(times["none"]), statistics.median(times["none"])
    result = {
        "machine": platform.node(), "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cp.__version__, "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
        "seconds_min": {k: min(v) for k, v in times.items()},
        "seconds_all": times,
        "seconds_median": {k: statistics.median(v) for k, v in times.items()},
        "ratio": {k: min(v) / base for k, v in times.items()},
        "ratio_median": {k: statistics.median(v) / mid for k, v in times.items()},
        "events_per_run": events,
        "events_per_s": {k: n / min(times[k]) * args.steps / (args.steps + args.warmup)
                         for k, n in events.items()},
        "cpu_seconds_min": {k: min(v) for k, v in CPU.items()},
        "cpu_ratio": {k: min(v) / min(CPU["none"]) for k, v in CPU.items()},
        "finalize_s_min": {k: min(v) for k, v in finalize_s.items()},
        "targets": {"record_sites": 1.15, "record_no_sites": 1.10},
    }
    text = json.dumps(result, indent=2)
    for k in times:
        print(f"{k:16} min {result['seconds_min'][k]:.4f} s  x{result['ratio'][k]:.3f}   "
              f"median {result['seconds_median'][k]:.4f} s  x{result['ratio_median'][k]:.3f}")
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
