"""The compiled hook's cost per malloc when a loop's mallocs come from many lines (many windows).

``bench_stack_capture.py`` calls the hook from one line, so every capture after the first is the same
window; a training step makes its mallocs from a few dozen lines. Here a generated loop body makes
``k`` mallocs (and frees) from ``k`` distinct lines, ``chain`` frames below this one, and each figure
is the minimum over 5 repeats of the mean ns per malloc/free pair, minus the same loop calling a
Python no-op (so a negative figure is a hook cheaper than a Python function call).

    PYTHONPATH=. python3 scripts/bench_hook_windows.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_stack_capture import _hook, at_depth

from tracekit.record.callstacks import DEFAULT_DEPTH


def make_loop(k):  # type: ignore[no-untyped-def]
    lines = ["def loop(malloc, free, calls):", "    for i in range(calls):"]
    for j in range(k):
        ptr = f"0x7F0000000000 + {j} * 1024"
        lines.append(f"        malloc(device_id=0, size=1000, mem_size=1024, mem_ptr={ptr}, pmem_id=0)")
        lines.append(f"        free(device_id=0, mem_size=1024, mem_ptr={ptr}, pmem_id=0)")
    ns: dict[str, object] = {}
    exec("\n".join(lines), ns)
    return ns["loop"]

def run(mode, limit, k, calls, reps, chain):  # type: ignore[no-untyped-def]
    best = 1e9
    loop = make_loop(k)
    for _ in range(reps):
        hook, buf = _hook(mode, limit)
        def go(hook=hook):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter_ns()
            loop(hook.malloc_postprocess, hook.free_postprocess, calls)
            return (time.perf_counter_ns() - t0) / (calls * k)
        loop(hook.malloc_postprocess, hook.free_postprocess, 10)
        best = min(best, at_depth(chain, go))
        buf.take()
    return best

def noop(k, calls, reps, chain):  # type: ignore[no-untyped-def]
    def f(**kw):  # type: ignore[no-untyped-def]
        return None
    loop = make_loop(k)
    def go():  # type: ignore[no-untyped-def]
        t0 = time.perf_counter_ns()
        loop(f, f, calls)
        return (time.perf_counter_ns() - t0) / (calls * k)
    return min(at_depth(chain, go) for _ in range(reps))

def main() -> int:
    for chain in (5, 20):
        for k in (1, 64, 200):
            calls = 20000 // k
            n = noop(k, calls, 5, chain)
            row = {m: run(m, lim, k, calls, 5, chain) - n
                   for m, lim in (("no_sites", 0), ("site", 0), ("stacks", DEFAULT_DEPTH))}
            print(f"chain {chain} k {k}: " + "  ".join(f"{m} {v:.0f} ns" for m, v in row.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
