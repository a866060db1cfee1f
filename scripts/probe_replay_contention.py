#!/usr/bin/env python3
"""One replay alone against the same replay on N threads at once: how much a replay's own CPU time
grows when advise runs its settings side by side (cores, caches, memory shared). On the H100 host:
2.0 s alone, 2.0-2.4 s each at 16 threads (docs/performance.md).

    PYTHONPATH=. python3 scripts/probe_replay_contention.py TRACE [--threads 1 4 8] [--setting K:V]

Prints one JSON line per thread count: wall, and each replay's thread CPU (min, max).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path


def _one(trace: object, options: dict[str, str], cpu: list[float]) -> None:
    """One unbounded replay; its thread's CPU seconds appended to ``cpu`` (list.append is atomic)."""
    from tracekit.advise.capacity import probe

    c = time.thread_time()
    probe(trace, "torch", None, options, counterfactual=True)  # type: ignore[arg-type]
    cpu.append(time.thread_time() - c)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16])
    ap.add_argument("--setting", default="expandable_segments:True")
    a = ap.parse_args()
    from tracekit.advise.capacity import probe
    from tracekit.advise.counterfactual import prepare
    from tracekit.sim.scratch import WORK
    from tracekit.trace.reader import read_trace

    trace = prepare(read_trace(a.trace))
    key, _, value = a.setting.partition(":")
    options = {key: value} if key else {}
    with WORK.keeping():
        probe(trace, "torch", None, options, counterfactual=True)  # set up, kernels loaded
        for n in a.threads:
            cpu: list[float] = []
            threads = [threading.Thread(target=_one, args=(trace, options, cpu)) for _ in range(n)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = round(time.perf_counter() - t0, 3)
            print(json.dumps({"threads": n, "cpus": os.cpu_count(), "wall_s": wall,
                              "cpu_min_s": round(min(cpu), 3), "cpu_max_s": round(max(cpu), 3)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
