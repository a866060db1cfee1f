"""Recording overhead on a CuPy MLP training loop: no hook, no-op hook, recording without call-sites,
with one call-site per malloc (``--stack-depth 0``) and with whole stacks (the default).

Each variant runs a warm-up of the loop (untimed, so a fresh recorded pool
has its segments) and then the timed loop, ending with a device sync; the
variants are interleaved over the repeats (the machine's speed drifts) and
the minimum and median are reported, with their ratios to the run without
any hook, and the allocation events per second. The targets are judged on the
minimum, the usual estimator for a noisy machine.
Targets: recording with call-sites at most 1.15x, without at most 1.10x; whole stacks at most 1.05x
the one-call-site recording (``ratio_stacks_to_sites``), all in the same run against CuPy's no-op
hook (``ratio_to_noop``).

    PYTHONPATH=. python3 scripts/bench_record_overhead.py [--steps 200] [--repeats 21] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cupy as cp
import numpy as np

from tracekit.record import CupyRecording
from tracekit.record.callstacks import DEFAULT_DEPTH
from tracekit.trace import read_trace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from perf_counters import ThreadCounters  # noqa: E402  (a script beside this one)

COUNTERS = ThreadCounters.open()  # the timed thread's instructions and cycles, where the host gives them
# --stack-depth of each recording variant: 0 keeps the one call-site alone, as before whole stacks
BLOCKING_SYNC = 0x04  # CU_CTX_SCHED_BLOCKING_SYNC


def blocking_sync() -> None:
    """Device 0's primary context (the one CuPy's runtime uses) made with waits that sleep, through
    the driver (CuPy has no ``cudaSetDeviceFlags``); before any context exists."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    for rc in (cuda.cuInit(0), cuda.cuDeviceGet(ctypes.byref(dev), 0),
               cuda.cuDevicePrimaryCtxSetFlags(dev, ctypes.c_uint(BLOCKING_SYNC))):
        if rc != 0:
            raise SystemExit(f"bench_record_overhead.py: --blocking-sync: CUDA driver error {rc}")
    flags, active = ctypes.c_uint(), ctypes.c_int()
    cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    assert flags.value & 0x7 == BLOCKING_SYNC, flags.value
DEPTHS = {"record_no_sites": 0, "record_sites": 0, "record_stacks": DEFAULT_DEPTH}


def _workloads():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("record_workloads", HERE / "record_workloads.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CPU: dict[str, list[float]] = {}
THREAD: dict[str, list[float]] = {}  # the timed thread's own CPU seconds (time.thread_time)
INSTRUCTIONS: dict[str, list[float]] = {}  # the timed thread's user-space instructions (COUNTERS)
CYCLES: dict[str, list[float]] = {}
TRIM: dict[str, list[float]] = {}


def time_trims(buffer, variant: str) -> None:  # type: ignore[no-untyped-def]
    """Seconds the program's thread spends writing the spool (``EventBuffer.trim``) go to
    TRIM[variant]; a recorder whose spool is written by its own thread has no ``trim``."""
    trim = getattr(buffer, "trim", None)
    if trim is None:
        return
    spent = TRIM.setdefault(variant, [])
    spent.append(0.0)

    def timed_trim() -> None:
        t0 = time.perf_counter()
        trim()
        spent[-1] += time.perf_counter() - t0
    buffer.trim = timed_trim


def _paired(counts: dict[str, list[float]]) -> dict[str, list[float]]:
    """Each variant's figure of each repeat over the no-op hook's in the same repeat."""
    return {k: [a / b for a, b in zip(v, counts["noop_hook"], strict=True)] for k, v in counts.items()}


def _median_over_noop(counts: dict[str, list[float]], events: dict[str, float]) -> dict[str, float]:
    """Each recording variant's median over the repeats of (its figure - the no-op hook's in the same
    repeat) / the events of a timed run; {} where nothing was counted."""
    if not counts:
        return {}
    return {k: statistics.median([(a - b) / n for a, b in zip(counts[k], counts["noop_hook"], strict=True)])
            for k, n in events.items()}


def timed(fn, steps: int, variant: str) -> float:  # type: ignore[no-untyped-def]
    """Wall seconds of ``fn(steps)`` to a device sync; process CPU seconds go to CPU[variant], the
    calling thread's to THREAD[variant] (with ``--blocking-sync`` that is the host work alone: a
    wait for the device sleeps instead of spinning)."""
    cp.cuda.Device().synchronize()
    k0 = COUNTERS.read() if COUNTERS else (0, 0)
    c0, h0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
    fn(steps)
    cp.cuda.Device().synchronize()
    wall = time.perf_counter() - t0
    if COUNTERS:
        k1 = COUNTERS.read()
        INSTRUCTIONS.setdefault(variant, []).append(k1[0] - k0[0])
        CYCLES.setdefault(variant, []).append(k1[1] - k0[1])
    THREAD.setdefault(variant, []).append(time.thread_time() - h0)
    CPU.setdefault(variant, []).append(time.process_time() - c0)
    return wall


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--shuffle", type=int, default=None, metavar="SEED",
                    help="run the variants of each repeat in a random order (seeded): a variant that "
                         "always follows another cannot inherit its cost (a clock ramp, a collection)")
    ap.add_argument("--blocking-sync", action="store_true",
                    help="waits for the device sleep (cudaDeviceScheduleBlockingSync) instead of spinning, "
                         "so the timed thread's CPU time is its host work alone: the recorder's own cost "
                         "per event, measured apart from the device's timing")
    args = ap.parse_args()
    if args.blocking_sync:  # before anything makes the device's context
        blocking_sync()
    order_rng = random.Random(args.shuffle)
    mlp = _workloads().run_mlp
    tmp = Path(tempfile.mkdtemp(prefix="tk-bench-"))
    mlp(args.warmup)
    times: dict[str, list[float]] = {"none": [], "noop_hook": [], "record_no_sites": [], "record_sites": [],
                                     "record_stacks": []}
    finalize_s: dict[str, list[float]] = {"record_no_sites": [], "record_sites": [], "record_stacks": []}
    stacks: dict[str, int] = {}
    events: dict[str, int] = {}
    for rep in range(args.repeats):
        order = list(times)
        if args.shuffle is not None:
            order_rng.shuffle(order)
        for variant in order:
            if variant == "none":
                mlp(args.warmup)
                times[variant].append(timed(mlp, args.steps, variant))
            elif variant == "noop_hook":
                with cp.cuda.MemoryHook():
                    mlp(args.warmup)
                    times[variant].append(timed(mlp, args.steps, variant))
            else:
                out = tmp / f"{variant}-{rep}.parquet"
                rec = CupyRecording(out, command=["bench"], sites=variant != "record_no_sites", force=True,
                                    stack_depth=DEPTHS[variant])
                rec.start()
                time_trims(rec.buffer, variant)
                mlp(args.warmup)
                times[variant].append(timed(mlp, args.steps, variant))
                t0 = time.perf_counter()
                rec.stop({"code": 0})
                finalize_s[variant].append(time.perf_counter() - t0)
                ev = read_trace(out, extras=False).events
                events[variant] = len(ev)
                stacks[variant] = int(len(np.unique(ev.stack[ev.stack >= 0])))
                out.unlink()
    base, mid = min(times["none"]), statistics.median(times["none"])
    # the events of one timed run: steps/(steps + warmup) of a recording's events (its warm-up is recorded)
    timed_events = {k: n * args.steps / (args.steps + args.warmup) for k, n in events.items()}
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
        "ratio_to_noop": {k: min(v) / min(times["noop_hook"]) for k, v in times.items()},
        # each repeat's variant over the same repeat's no-op hook (run within seconds of each other):
        # the drift of the machine between repeats cancels
        "paired_to_noop": _paired(times),
        "ratio_stacks_to_sites": min(times["record_stacks"]) / min(times["record_sites"]),
        "ratio_stacks_to_sites_median": statistics.median(times["record_stacks"])
        / statistics.median(times["record_sites"]),
        "distinct_stacks": stacks,
        "events_per_run": events,
        "events_per_s": {k: n / min(times[k]) for k, n in timed_events.items()},
        "cpu_seconds_min": {k: min(v) for k, v in CPU.items()},
        "cpu_ratio": {k: min(v) / min(CPU["none"]) for k, v in CPU.items()},
        "blocking_sync": args.blocking_sync,
        "thread_cpu_all": THREAD,
        # each repeat's timed-thread CPU seconds over the same repeat's no-op hook, and their
        # difference per allocation event of the timed run (µs): the recorder's own host cost
        "paired_thread_cpu_to_noop": _paired(THREAD),
        "thread_cpu_us_per_event_over_noop": {k: x * 1e6
                                              for k, x in _median_over_noop(THREAD, timed_events).items()},
        "counters": COUNTERS is not None,
        "instructions_all": INSTRUCTIONS, "cycles_all": CYCLES,
        # per allocation event of the timed run, over the no-op hook of the same repeat (median)
        "instructions_per_event_over_noop": _median_over_noop(INSTRUCTIONS, timed_events),
        "cycles_per_event_over_noop": _median_over_noop(CYCLES, timed_events),
        "paired_instructions_to_noop": {k: statistics.median(v) for k, v in _paired(INSTRUCTIONS).items()},
        "paired_cycles_to_noop": {k: statistics.median(v) for k, v in _paired(CYCLES).items()},
        "other_threads_cpu_median": {
            k: statistics.median([c - t for c, t in zip(CPU[k], THREAD[k], strict=True)]) for k in THREAD},
        "trim_s_median": {k: statistics.median(v) for k, v in TRIM.items()},
        "finalize_s_min": {k: min(v) for k, v in finalize_s.items()},
        "targets": {"record_sites": 1.15, "record_no_sites": 1.10, "stacks_to_sites": 1.05},
    }
    text = json.dumps(result, indent=2)
    for k in times:
        print(f"{k:16} min {result['seconds_min'][k]:.4f} s  x{result['ratio'][k]:.3f}   "
              f"median {result['seconds_median'][k]:.4f} s  x{result['ratio_median'][k]:.3f}")
    print(f"whole stacks / one call-site: x{result['ratio_stacks_to_sites']:.3f} (min), "
          f"x{result['ratio_stacks_to_sites_median']:.3f} (median); target x1.05")
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
