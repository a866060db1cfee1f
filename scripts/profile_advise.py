"""Where ``advise``'s time goes: the read, then every batch of tasks (``advise.search.Runner.map``)
with its tasks, how many ran in this process and how long the batch took, in one run as a user
runs it (``--jobs`` as given, else advise's own choice).

    PYTHONPATH=. python3 scripts/profile_advise.py TRACE [--jobs N] [--json OUT]

Prints one line per batch and a JSON summary; the answer is advise's own (``--json`` of the command).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    t0 = time.perf_counter()
    from tracekit.advise import search
    from tracekit.trace.reader import read_trace

    trace = read_trace(a.trace)
    t_read = time.perf_counter() - t0
    batches: list[dict[str, object]] = []
    plain = search.Runner.map

    def timed(self: search.Runner, tasks):  # type: ignore[no-untyped-def]
        t = time.perf_counter()
        out = plain(self, tasks)
        kinds = sorted({("probe " if x.probe else "") + (x.candidate.policy or "?") for x in tasks})
        batches.append({"tasks": len(tasks), "probes": sum(x.probe for x in tasks), "what": kinds,
                        "seconds": round(time.perf_counter() - t, 3),
                        "threads": self.jobs})
        print(f"batch {len(batches)}: {len(tasks)} task(s) {kinds}: {batches[-1]['seconds']} s"
              f" on {self.jobs} thread(s)",
              file=sys.stderr, flush=True)
        return out

    search.Runner.map = timed  # type: ignore[method-assign]
    from tracekit.advise.run import advise

    t1 = time.perf_counter()
    result = advise(trace, jobs=a.jobs)
    t_advise = time.perf_counter() - t1
    summary = {"trace": str(a.trace), "events": len(trace.events), "read_s": round(t_read, 3),
               "advise_s": round(t_advise, 3), "batches": batches,
               "batches_s": round(sum(float(b["seconds"]) for b in batches), 3),  # type: ignore[arg-type]
               "min_capacity": result.min_capacity, "tried": len(result.tried)}
    print(json.dumps(summary))
    if a.json:
        a.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
