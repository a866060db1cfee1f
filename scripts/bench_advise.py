"""Benchmark ``tracekit advise`` on a 1M-event trace (target: 60 s on the 2-core machine).

Writes a synthetic trace of N events (``--pattern``, default ``training``), then relabels
it as a PyTorch, a CuPy and a raw trace with a limit 2 % above the live-bytes lower bound
(so little fits and the whole search runs, bisections included: the worst case), and times the whole command
``python -m tracekit advise FILE --json`` in a fresh process for each: wall seconds, the
settings tried and how many fit, and the recommendation.

    PYTHONPATH=. python scripts/bench_advise.py [--events 1000000] [--jobs 2] [--kinds torch,cupy,raw]
        [--pattern training|random|fragmenting]

Without ``--jobs`` advise runs plain, choosing its own threads (``tracekit.workers.default_threads``),
as a user runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def relabel(src: Path, dst: Path, kind: str) -> int:
    """Write ``src`` as a ``kind`` trace whose limit is 2 % above the live-bytes lower bound."""
    from tracekit.advise.capacity import lower_bound
    from tracekit.trace import write_trace
    from tracekit.trace.reader import read_trace
    from tracekit.trace.schema import Source

    t = read_trace(src)
    limit = int(lower_bound(t) * 1.02) // 512 * 512
    source = {"torch": Source.TORCH, "cupy": Source.CUPY, "raw": Source.SYNTHETIC}[kind]
    meta = replace(t.meta, source=source, pool_limit_bytes=limit)
    write_trace(dst, meta, t.events, t.extras)
    return limit


def run(path: Path, jobs: int | None, limit: int, kind: str) -> dict[str, object]:
    cmd = [sys.executable, "-m", "tracekit", "advise", str(path), "--json"]
    if jobs is not None:
        cmd += ["--jobs", str(jobs)]
    if kind == "raw":
        cmd += ["--limit", str(limit)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    res = json.loads(out.stdout)
    return {
        "kind": kind, "wall_s": round(wall, 2), "load_1min": round(os.getloadavg()[0], 2),
        "tried": len(res["tried"]), "fits": len(res["fits"]), "min_capacity_bytes": res["min_capacity_bytes"],
        "recommendation": res["recommendation"],
    }


REPLAY_SIM = {"torch": "torch", "cupy": "cupy", "raw": "best-fit"}


def replay_s(path: Path, kind: str, limit: int) -> float:
    """Wall seconds of one whole ``replay --sim`` of ``path`` in a fresh process (raw: under ``limit``)."""
    cmd = [sys.executable, "-m", "tracekit", "replay", str(path), "--sim", REPLAY_SIM[kind]]
    if kind == "raw":
        cmd += ["--capacity", str(limit)]
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, text=True, check=False)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--jobs", type=int, default=None, help="advise --jobs (default: advise chooses)")
    ap.add_argument("--kinds", default="torch,cupy,raw")
    ap.add_argument("--pattern", default="training", choices=["training", "random", "fragmenting"])
    ap.add_argument("--replay", type=int, default=0, help="interleaved runs of advise and of one replay")
    ap.add_argument("--keep", type=Path, default=None, help="folder for the traces (reused when present)")
    a = ap.parse_args()
    env_py = [sys.executable, "-m", "tracekit"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        src = folder / f"{a.pattern}-{a.events}.parquet"
        if not src.exists():
            synth = [*env_py, "synth", "--pattern", a.pattern, "--events", str(a.events), "-o", str(src)]
            subprocess.run(synth, check=True, capture_output=True)
        for kind in a.kinds.split(","):
            dst = folder / f"{a.pattern}-{a.events}-{kind}.parquet"
            limit = relabel(src, dst, kind)
            runs = [] if a.replay else [run(dst, a.jobs, limit, kind)]
            replays: list[float] = []
            for _ in range(a.replay):
                runs.append(run(dst, a.jobs, limit, kind))
                replays.append(replay_s(dst, kind, limit))
            r = min(runs, key=lambda x: float(x["wall_s"]))  # type: ignore[arg-type]
            row = {"pattern": a.pattern, "events": a.events, "jobs": a.jobs, "limit_bytes": limit, **r}
            if replays:
                row |= {"advise_walls_s": [x["wall_s"] for x in runs], "replay_s": round(min(replays), 2),
                        "replay_walls_s": [round(x, 2) for x in replays],
                        "advise_to_replay": round(float(r["wall_s"]) / min(replays), 2)}  # type: ignore[arg-type]
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
