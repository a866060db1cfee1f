"""Each task of one ``advise`` run: when it started and ended (seconds from the search's start), on
which thread, and its kind; then the sum of the tasks' times against the batch's wall time, so a
batch whose threads wait on each other (the GIL, a lock, fresh memory) shows as a sum far above
``threads x wall``.

    PYTHONPATH=. python3 scripts/profile_advise_tasks.py TRACE [--jobs N]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args()
    from tracekit.advise import search
    from tracekit.advise.run import advise
    from tracekit.trace.reader import read_trace

    trace = read_trace(a.trace)
    rows: list[tuple[float, float, str, str]] = []
    plain = search._run
    t0 = time.perf_counter()

    def timed(trace, counterfactual, task):  # type: ignore[no-untyped-def]
        s = time.perf_counter() - t0
        out = plain(trace, counterfactual, task)
        rows.append((round(s, 3), round(time.perf_counter() - t0, 3), threading.current_thread().name,
                     ("probe " if task.probe else "") + str(task.candidate.options or task.candidate.policy)))
        return out

    search._run = timed  # type: ignore[assignment]
    advise(trace, jobs=a.jobs)
    wall = time.perf_counter() - t0
    for r in sorted(rows):
        print(*r)
    busy = sum(e - s for s, e, _, _ in rows)
    print(json.dumps({"advise_s": round(wall, 3), "tasks": len(rows), "sum_of_task_s": round(busy, 3),
                      "threads": len({r[2] for r in rows})}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
