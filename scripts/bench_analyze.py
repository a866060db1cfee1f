"""Benchmark ``tracekit analyze`` on large synthetic traces: wall time, CPU time, peak RSS.

Usage: python3 scripts/bench_analyze.py [--events 10000000] [--dir /tmp/tracekit-bench] [--seed 1]

Builds (once, cached in --dir) a ``random`` synthetic trace of N events, which
is a raw-device trace (no segment rows), and its replay through the ``cupy``
pool model, which adds segment rows so the largest-free-block structure does
real work. Then runs the whole command (``python -m tracekit analyze TRACE
--json``, and once with ``--timeline``) in a fresh process per run and prints
wall seconds, CPU seconds (user + sys) and peak RSS of that process, with the
load average beside them (other work on the machine inflates wall time; CPU
time is the steadier figure). Target: under 10 s and 2 GiB at 10 M events.

Then, in the same run, against C++: ``scripts/bench_bestfit.cpp`` (best fit with std::set,
``g++ -O2``) replays the raw trace's requests, and the analysis runs in this process on both
traces, already read (``analyze_trace``, best of --repeat). All CPU seconds; the ratio is
analysis / C++ replay (target: <= 1.0), and the whole command's CPU against the same C++ loop.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(cmd: list[str]) -> tuple[float, float, float, int]:
    """(wall s, cpu s, peak RSS MiB, exit code) of one child process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode:
        sys.stderr.write(p.stderr.read().decode() if p.stderr else "")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, p.returncode


def build(n: int, seed: int, folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    raw = folder / f"random-{n}-{seed}.parquet"
    pooled = folder / f"random-{n}-{seed}-cupy.parquet"
    py = [sys.executable, "-m", "tracekit"]
    if not raw.exists():
        print(f"building {raw} ...", flush=True)
        subprocess.run([*py, "synth", "--pattern", "random", "--events", str(n), "--seed", str(seed),
                        "-o", str(raw)], check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if not pooled.exists():
        print(f"building {pooled} (cupy replay) ...", flush=True)
        subprocess.run([*py, "replay", str(raw), "--sim", "cupy", "-o", str(pooled)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    return raw, pooled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracekit-bench"))
    ap.add_argument("--repeat", type=int, default=2, help="runs per case; the best is kept")
    a = ap.parse_args()
    raw, pooled = build(a.events, a.seed, a.dir)
    py = [sys.executable, "-m", "tracekit", "analyze"]
    # Warm the numba cache once so compile time is not measured.
    run([*py, str(raw), "--json"])
    print(f"machine: {platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{'case':<34}{'events':>12}{'wall s':>9}{'cpu s':>8}{'RSS MiB':>9}{'load':>7}")
    tl = a.dir / "timeline.parquet"
    cases = [
        ("raw device (no segments)", [*py, str(raw), "--json"], raw),
        ("cupy replay (segments)", [*py, str(pooled), "--json"], pooled),
        ("cupy replay + --timeline", [*py, str(pooled), "--json", "--timeline", str(tl), "--force"], pooled),
    ]
    import pyarrow.parquet as pq

    whole: dict[str, float] = {}
    for name, cmd, path in cases:
        best = None
        for _ in range(a.repeat):
            r = run(cmd)
            if r[3] != 0:
                raise SystemExit(f"{name}: exit code {r[3]}")
            best = r if best is None or r[0] < best[0] else best
        assert best is not None
        n = pq.ParquetFile(path).metadata.num_rows
        print(f"{name:<34}{n:>12,}{best[0]:>9.2f}{best[1]:>8.2f}{best[2]:>9.0f}{os.getloadavg()[0]:>7.2f}")
        whole[name] = best[1]
    tl.unlink(missing_ok=True)
    against_cpp(raw, pooled, a.dir, a.repeat, whole)


def against_cpp(raw: Path, pooled: Path, tmp: Path, repeat: int, whole: dict[str, float]) -> None:
    """Analysis CPU seconds (in process, trace already read) against the C++ best-fit loop."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_sim import cpp_best_fit

    from tracekit.analysis import analyze_trace
    from tracekit.trace import read_trace

    cpp = cpp_best_fit(read_trace(raw), tmp, max(repeat, 3))
    if cpp is None:
        print("against C++: no C++ compiler found, skipped")
        return
    print(f"C++ std::set best fit, {raw.name}: {cpp[0]:.3f} CPU s (loop alone, best of {max(repeat, 3)})")
    for name, path in (("raw device (no segments)", raw), ("cupy replay (segments)", pooled)):
        tr = read_trace(path)
        best = None
        for _ in range(max(repeat, 3)):
            t0 = time.process_time()
            analyze_trace(tr)
            cpu = time.process_time() - t0
            best = cpu if best is None else min(best, cpu)
        assert best is not None
        print(f"  analysis of {name}: {best:.3f} CPU s, {best / cpp[0]:.2f}x the C++ replay; "
              f"whole command {whole[name]:.2f} CPU s, {whole[name] / cpp[0]:.2f}x")


if __name__ == "__main__":
    main()
