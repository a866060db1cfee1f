"""Where a replay with a head start spends its time: the reader's windows, the head start's pairing
and kernel steps (start and seconds, in its thread), the read's end and the answer, in one process;
then the same trace read and replayed one after the other, step by step, for comparison.

    PYTHONPATH=. python3 scripts/profile_head_start.py TRACE [--sim best-fit]

Prints one JSON object (seconds from the script's start).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

T0 = time.perf_counter()


def _clock() -> float:
    return round(time.perf_counter() - T0, 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--sim", default="best-fit")
    a = ap.parse_args()
    os.environ["TRACEKIT_HEAD_START"] = "1"
    import tracekit.sim._head_kernel as k
    import tracekit.sim.policies.freelist as fl
    from tracekit.sim import policies
    from tracekit.sim.base import SimConfig
    from tracekit.sim.head_start import head_start
    from tracekit.trace.reader import read_trace

    events: list[Any] = []
    step, pair = fl.HeapSteps.step, k.pair

    def timed_step(self: Any, *args: Any) -> bool:
        t = time.perf_counter()
        r = step(self, *args)
        events.append(("step", args[-2], args[-1], round(t - T0, 3), round(time.perf_counter() - t, 3)))
        return r

    def timed_pair(*args: Any) -> Any:
        t = time.perf_counter()
        r = pair(*args)
        events.append(("pair", args[4], args[5], round(t - T0, 3), round(time.perf_counter() - t, 3)))
        return r

    fl.HeapSteps.step = timed_step  # type: ignore[method-assign]
    k.pair = timed_pair
    out: dict[str, Any] = {"cpus": os.cpu_count()}
    model, config = policies.get(a.sim), SimConfig()
    with head_start(model, config) as head:
        assert head is not None
        take = head.take

        def timed_take(w: Any) -> None:
            events.append(("window", w.at, w.at + w.rows, _clock()))
            take(w)

        trace = read_trace(a.trace, on_window=timed_take)
        out["read_end"], out["done_at_read_end"] = _clock(), head.done
        run = head.finish(trace)
        out["head_answer"], out["head_used"] = _clock(), run is not None
    out["head_timeline"] = events[:]
    events.clear()
    t = time.perf_counter()
    trace = read_trace(a.trace)
    out["plain_read_s"] = round(time.perf_counter() - t, 3)
    t = time.perf_counter()
    plain = model.run(trace, config)
    out["plain_run_s"] = round(time.perf_counter() - t, 3)
    out["plain_steps"] = events[:]
    out["same_stats"] = run is not None and bool((run.stats == plain.stats).all())
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
