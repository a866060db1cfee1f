"""How long advise's workers take to start, by how many start at once (issue 45 item 4).

For each N: N replays at the trace's limit (PyTorch's single settings, ``candidates.single_torch``,
repeated to N) one after another in this process; then a fresh advise runner
(``tracekit.advise.search.Runner``) with N workers started at once (``Pool.start_now``): seconds
until every worker has made its input ready (N trivial tasks queued behind the set-up come back),
and seconds for the same N replays on them.

    PYTHONPATH=. python3 scripts/bench_worker_start.py TRACE [--workers 1,4,16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _stamp() -> float:
    return time.perf_counter()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--workers", default="1,4,16")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    from tracekit.advise import candidates as cands
    from tracekit.advise.run import pick_limit
    from tracekit.advise.search import Runner, Task
    from tracekit.trace.reader import read_trace

    trace = read_trace(a.trace)
    limit = pick_limit(trace, None, None)
    singles = cands.single_torch()
    rows = []
    for n in (int(x) for x in a.workers.split(",")):
        tasks = [Task(c, limit, None) for c in (singles * ((n // len(singles)) + 1))[:n]]
        here = Runner(trace, 1, counterfactual=True)
        t0 = time.perf_counter()
        here.map(tasks)
        alone = time.perf_counter() - t0
        here.close()
        t0 = time.perf_counter()
        r = Runner(trace, n, counterfactual=True, early=True)
        for f in [r.pool._executor().submit(_stamp) for _ in range(n)]:  # queued behind each set-up
            f.result()
        t1 = time.perf_counter()
        r.map(tasks)
        batch = time.perf_counter() - t1
        r.close()
        rows.append({"workers": n, "tasks": len(tasks), "in_process_s": round(alone, 3),
                     "workers_ready_s": round(t1 - t0, 3), "batch_on_workers_s": round(batch, 3)})
        print(json.dumps(rows[-1]), flush=True)
    out = {"trace": str(a.trace), "events": len(trace.events), "cpus": os.cpu_count(), "rows": rows}
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
