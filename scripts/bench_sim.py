#!/usr/bin/env python3
"""Benchmark simulated replay: events/s and peak RSS of the whole ``tracekit replay`` command.

For each policy this runs ``python -m tracekit replay TRACE --sim POLICY --json``
in a fresh process (reading the Parquet, replaying, printing the JSON) and
reports the wall time, events per second (input events / wall time), the
child's CPU time (user + system; on a shared machine the steadier figure) and
its peak resident memory (``os.wait4`` rusage). One untimed run per policy
comes first so compiled kernels are in numba's cache, as they are after the
first use on a machine. The trace is a ``tracekit synth`` trace (default: 10
million ``random`` events) unless ``--trace`` names one.

Then, in the same run, the C++ bar: ``scripts/bench_bestfit.cpp`` (best fit with
``std::set``/``std::map``, built here with ``g++ -O2``) replays the same
requests, and the ``best-fit`` kernel replays them in this process (the trace's
arrays prepared once, as a what-if search does). Both report CPU seconds of the
replay loop alone; the ratio is C++ CPU / tracekit CPU (>= 1.0: as fast as
C++ or faster), and both must agree on peak live bytes and peak extent.

    python3 scripts/bench_sim.py [--events 10000000] [--pattern random] [--policy best-fit ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def tracekit(*args: str, capture: bool = True) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, "-m", "tracekit", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def run_one(trace: Path, policy: str) -> tuple[float, float, int, dict | None, str]:
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-m", "tracekit", "replay", str(trace), "--sim", policy, "--json"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")},
    )
    assert p.stdout is not None and p.stderr is not None
    # Read the pipes to the end, then reap the child with wait4 for its own rusage.
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    rss = usage.ru_maxrss * 1024  # KiB on Linux
    cpu = usage.ru_utime + usage.ru_stime
    try:
        doc = json.loads(out) if p.returncode == 0 else None
    except ValueError:
        doc = None
    return wall, cpu, rss, doc, err.decode()


def cpp_best_fit(tr: object, tmp: Path, repeat: int) -> tuple[float, int, int] | None:
    """(CPU s of the loop, best of ``repeat``; peak live bytes; peak extent) of the C++ std::set
    best fit over the trace's prepared requests, or None without a C++ compiler."""
    from tracekit.sim.prepare import prepare

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        return None
    exe = tmp / "bench_bestfit"
    subprocess.run([cxx, "-O2", "-std=c++17", "-o", str(exe), str(ROOT / "scripts" / "bench_bestfit.cpp")],
                   check=True)
    inp = prepare(tr)  # type: ignore[arg-type]
    data = tmp / "requests.bin"
    with open(data, "wb") as f:
        for arr in (np.array([len(inp)], np.int64), inp.kind.astype(np.int8), inp.size, inp.mate):
            f.write(np.ascontiguousarray(arr).tobytes())
    cpp = min((subprocess.run([str(exe), str(data)], capture_output=True, text=True,
                              check=True).stdout.split()
               for _ in range(repeat)), key=lambda r: float(r[0]))
    data.unlink()
    return float(cpp[0]), int(cpp[1]), int(cpp[2])


def cpp_bar(trace: Path, tmp: Path, repeat: int) -> None:
    """Best fit in C++ (std::set) against the best-fit kernel, CPU seconds of the loop alone."""
    from tracekit.sim.engine import replay
    from tracekit.trace.reader import read_trace

    tr = read_trace(trace)
    cpp = cpp_best_fit(tr, tmp, repeat)
    if cpp is None:
        print("C++ bar: no C++ compiler found, skipped")
        return
    replay(tr, "best-fit")  # compiled kernels loaded, arrays prepared
    ours = None
    for _ in range(repeat):
        t0 = time.process_time()
        res = replay(tr, "best-fit")
        cpu = time.process_time() - t0
        ours = cpu if ours is None else min(ours, cpu)
    assert ours is not None
    same = (cpp[1], cpp[2]) == (res.summary.peak_live_bytes, res.summary.peak_extent)
    print(f"C++ bar (best fit, {len(tr.events):,} events, CPU s of the loop): std::set {cpp[0]:.3f}, "
          f"tracekit {ours:.3f}, ratio {cpp[0] / ours:.2f}x; same peaks: {'yes' if same else 'NO'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pattern", default="random", choices=["random", "training", "fragmenting"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trace", type=Path, help="Use this trace instead of synthesizing one.")
    ap.add_argument("--policy", action="append", help="Policy to time (repeatable; default: all).")
    ap.add_argument("--repeat", type=int, default=1, help="Timed runs per policy (best is reported).")
    ap.add_argument("--no-cpp", action="store_true", help="Skip the C++ std::set best-fit bar.")
    a = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    from tracekit.sim import policies

    names = a.policy or policies.names()
    tmp = Path(tempfile.mkdtemp(prefix="bench_sim_"))
    trace = a.trace
    if trace is None:
        trace = tmp / f"{a.pattern}_{a.events}.parquet"
        t0 = time.perf_counter()
        p = tracekit("synth", "--pattern", a.pattern, "--events", str(a.events), "--seed", str(a.seed),
                     "-o", str(trace))
        _, err = p.communicate()
        if p.returncode:
            print(err.decode(), file=sys.stderr)
            return 1
        print(f"synth {a.pattern} {a.events:,} events: {time.perf_counter() - t0:.1f} s")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"trace: {trace} ({trace.stat().st_size / 2**20:.0f} MiB)")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'policy':<12} {'wall s':>7} {'Mev/s':>6} {'CPU s':>6} {'Mev/CPU-s':>9} "
          f"{'peak RSS MiB':>12}  result")
    for name in names:
        run_one(trace, name)  # warm numba's cache
        best = None
        for _ in range(a.repeat):
            r = run_one(trace, name)
            if best is None or r[0] < best[0]:
                best = r
        assert best is not None
        wall, cpu, rss, doc, err = best
        if doc is None:
            print(f"{name:<12} failed: {err.strip().splitlines()[-1] if err.strip() else '?'}")
            continue
        n = doc["events"]
        oom = "no OOM" if doc["oom"] is None else f"OOM at seq {doc['oom']['seq']}"
        print(f"{name:<12} {wall:>7.2f} {n / wall / 1e6:>6.2f} {cpu:>6.2f} {n / cpu / 1e6:>9.2f} "
              f"{rss / 2**20:>12.0f}  {oom}")
    if not a.no_cpp:
        cpp_bar(trace, tmp, max(a.repeat, 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
