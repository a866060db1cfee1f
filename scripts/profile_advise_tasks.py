"""Each task of one ``advise`` run: when it started and ended (seconds from the search's start), on
which thread, its own CPU seconds (``thread_time``) and its kind; then the sum of the tasks' times
against the batch's wall time, so a batch whose threads wait on each other (the GIL, a lock, fresh
memory) shows as a sum far above ``threads x wall``.

``--pretend-cpus N``: the search as it runs on N usable CPUs (its threads and rounds: how many
replays each round makes ahead), whatever this machine has; the **critical path** it prints is
then what N free cores would take: the search's own work on the main thread before the first task,
plus, batch after batch (the tasks asked for together, ``Runner.map``), the CPU seconds of its
longest task. A 2-core machine so tells what the 16-core host's search waits on.

    PYTHONPATH=. python3 scripts/profile_advise_tasks.py TRACE [--jobs N] [--pretend-cpus N]
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
    ap.add_argument("--pretend-cpus", type=int, default=None)
    a = ap.parse_args()
    import tracekit.workers as workers

    if a.pretend_cpus:
        workers.usable_cpus = lambda: a.pretend_cpus  # type: ignore[assignment]
    from tracekit.advise import search
    from tracekit.advise.run import advise
    from tracekit.trace.reader import read_trace

    trace = read_trace(a.trace)
    rows: list[tuple[float, float, float, str, str]] = []
    batches: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    plain, plain_map = search._run, search.Runner.map
    t0 = time.perf_counter()

    def timed(trace, counterfactual, task):  # type: ignore[no-untyped-def]
        s, c = time.perf_counter() - t0, time.thread_time()
        out = plain(trace, counterfactual, task)
        with lock:
            what = ("probe " if task.probe else "") + str(task.candidate.options or task.candidate.policy)
            rows.append((round(s, 3), round(time.perf_counter() - t0, 3), round(time.thread_time() - c, 3),
                         threading.current_thread().name,
                         what + (f" @{task.capacity}" if task.capacity is not None else "")))
        return out

    def mapped(self, tasks):  # type: ignore[no-untyped-def]
        s = time.perf_counter() - t0
        out = plain_map(self, tasks)
        batches.append((s, time.perf_counter() - t0, len(tasks)))
        return out

    search._run = timed  # type: ignore[assignment]
    search.Runner.map = mapped  # type: ignore[method-assign]
    advise(trace, jobs=a.jobs)
    wall = time.perf_counter() - t0
    rows.sort()
    for r in rows:
        print(*r)
    busy = sum(e - s for s, e, _, _, _ in rows)
    # Each task is charged to the batch that was waiting when it ended (a task begun ahead, to the
    # batch that took its answer); the critical path: the main thread's work before the first task,
    # then per batch its longest task's CPU.
    first = rows[0][0] if rows else 0.0
    path = first
    for s, e, n in batches:
        inside = [cpu for _, end, cpu, _, _ in rows if s <= end <= e + 1e-3]
        if n and inside:
            path += max(inside)
    print(json.dumps({"advise_s": round(wall, 3), "tasks": len(rows), "sum_of_task_s": round(busy, 3),
                      "sum_of_task_cpu_s": round(sum(r[2] for r in rows), 3),
                      "threads": len({r[3] for r in rows}), "before_first_task_s": round(first, 3),
                      "critical_path_cpu_s": round(path, 3), "batches": len(batches)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
