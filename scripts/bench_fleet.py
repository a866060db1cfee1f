"""Benchmark ``tracekit fleet`` against analyzing the same traces one after another.

Usage: python3 scripts/bench_fleet.py [--dir /tmp/tracekit-bench-fleet] [--events 300000]
                                      [--synthetic 24] [--real 15] [--ranks 1024] [--ray]

The fleet (built once, cached in --dir): every recorded trace under traces/,
topped up to --real with replays of them (``tracekit replay --sim cupy`` of the
CuPy traces, ``--sim torch`` of the PyTorch ones: real workloads through the
simulated pools), and --synthetic synthetic traces of --events events each
(training, random and fragmenting in turn, one seed each). Cases, each a fresh
process timed as a whole (wall seconds, and the driver's own peak RSS where the
driver reports it):

- ``one after another``: ``python -m tracekit analyze TRACE --json`` per trace,
  sequentially: what a script without ``fleet`` does (the baseline).
- ``fleet --jobs 1``: one process analyzing them one after another.
- ``fleet`` (local, one worker per CPU) and, with --ray, ``fleet --engine ray``
  (a local Ray instance started and stopped inside the timing).
- ``fleet`` over --ranks members (hard links to the fleet's files named
  ``ddp.rankN.parquet``): the driver's peak RSS with many rows.

The numba kernels are compiled into the cache once before timing. The load
average is printed beside each line: other work on the machine inflates wall
time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PY = [sys.executable, "-m", "tracekit"]
PATTERNS = ("training", "random", "fragmenting")
# Runs the fleet in a child and prints the driver's own peak RSS (ru_maxrss of RUSAGE_SELF).
DRIVER = (
    "import json, resource, sys, time\n"
    "from tracekit.fleet import Engine, FleetOptions, run_fleet\n"
    "t = time.perf_counter()\n"
    "r = run_fleet([sys.argv[1]], FleetOptions(engine=Engine(sys.argv[2]), jobs=int(sys.argv[3]) or None))\n"
    "secs = r.table.get_column('seconds')\n"
    "print(json.dumps({'rows': r.table.height, 'errors': len(r.summary.errors),\n"
    "  'rss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,\n"
    "  'member_s_sum': float(secs.sum()), 'member_s_median': float(secs.median()),\n"
    "  'member_s_max': float(secs.max()), 'wall_in_driver': time.perf_counter() - t}))\n"
)


def sh(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL)


def build(folder: Path, events: int, synthetic: int, real: int) -> Path:
    """The fleet folder: real traces, replays of them up to ``real``, ``synthetic`` synthetic ones."""
    recorded = sorted((ROOT / "traces").glob("*.parquet"))
    # The folder's name fixes its contents: traces/ may gain recordings between runs.
    fleet = folder / f"fleet-{len(recorded)}-{real}-{synthetic}-{events}"
    fleet.mkdir(parents=True, exist_ok=True)
    for p in recorded[:real]:
        dst = fleet / p.name
        if not dst.exists():
            dst.write_bytes(p.read_bytes())
    for k in range(max(0, real - len(recorded))):
        src = recorded[k % len(recorded)]
        policy = "torch" if src.name.startswith("torch") else "cupy"
        dst = fleet / f"{src.stem}-replay-{policy}.parquet"
        if not dst.exists():
            sh([*PY, "replay", str(src), "--sim", policy, "--capacity", "none", "-o", str(dst)])
    for i in range(synthetic):
        pattern = PATTERNS[i % len(PATTERNS)]
        dst = fleet / f"synth-{pattern}-{i:02d}.parquet"
        if not dst.exists():
            sh([*PY, "synth", "--pattern", pattern, "--events", str(events), "--seed", str(i + 1),
                "-o", str(dst)])
    return fleet


def ranks_folder(fleet: Path, n: int) -> Path:
    """``n`` hard links to the fleet's files, named as the ranks of one job."""
    out = fleet.parent / f"ranks-{n}"
    out.mkdir(exist_ok=True)
    files = sorted(fleet.glob("*.parquet"))
    for i in range(n):
        dst = out / f"ddp.rank{i}.parquet"
        if not dst.exists():
            os.link(files[i % len(files)], dst)
    return out


def timed(cmd: list[str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd[:6])} ...: exit {p.returncode}\n{p.stderr}")
    return wall, p.stdout


def driver(folder: Path, engine: str, jobs: int) -> tuple[float, dict]:
    wall, out = timed([sys.executable, "-c", DRIVER, str(folder), engine, str(jobs)])
    return wall, json.loads(out.strip().splitlines()[-1])


def line(name: str, n: int, wall: float, base: float | None, rss: float | None) -> None:
    ratio = f"{wall / base:.2f}x" if base else ""
    mem = f"{rss:.0f}" if rss is not None else ""
    print(f"{name:<34}{n:>7}{wall:>9.2f}{ratio:>9}{mem:>10}{os.getloadavg()[0]:>7.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tracekit-bench-fleet"))
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--synthetic", type=int, default=24)
    ap.add_argument("--real", type=int, default=15)
    ap.add_argument("--ranks", type=int, default=1024, help="members of the many-ranks case (0: skip it)")
    ap.add_argument("--ray", action="store_true", help="also time --engine ray (Ray must be installed)")
    a = ap.parse_args()
    fleet = build(a.dir, a.events, a.synthetic, a.real)
    files = sorted(fleet.glob("*.parquet"))
    sh([*PY, "analyze", str(files[-1]), "--json"])  # numba's cache is warm from here on
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; fleet {fleet}")
    print(f"{'case':<34}{'traces':>7}{'wall s':>9}{'vs base':>9}{'drv MiB':>10}{'load':>7}")
    t0 = time.perf_counter()
    for f in files:
        timed([*PY, "analyze", str(f), "--json"])
    base = time.perf_counter() - t0
    line("one after another (analyze each)", len(files), base, None, None)
    wall, d = driver(fleet, "local", 1)
    line("fleet --jobs 1 (one process)", d["rows"], wall, base, d["rss_mib"])
    print(f"  per member in the worker: median {d['member_s_median']:.3f} s, max {d['member_s_max']:.3f} s, "
          f"sum {d['member_s_sum']:.2f} s")
    wall, d = driver(fleet, "local", 0)
    line("fleet (local, one worker per CPU)", d["rows"], wall, base, d["rss_mib"])
    wall, _ = timed([*PY, "fleet", str(fleet), "-o", str(a.dir / "fleet.parquet"), "--force"])
    line("tracekit fleet -o (whole command)", len(files), wall, base, None)
    if a.ray:
        wall, d = driver(fleet, "ray", 0)
        line("fleet --engine ray (local Ray)", d["rows"], wall, base, d["rss_mib"])
    if a.ranks:
        many = ranks_folder(fleet, a.ranks)
        wall, d = driver(many, "local", 0)
        line(f"fleet over {a.ranks} ranks (local)", d["rows"], wall, None, d["rss_mib"])


if __name__ == "__main__":
    main()
