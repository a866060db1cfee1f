"""Per-malloc cost of the recorder's hook on the CPU: no call-site, one call-site, whole stacks.

The hook is driven as CuPy drives it (``malloc_postprocess`` with keywords, then a free) from a
Python call chain ``depth`` frames deep (10, 30, 100), at one line, so every capture after the first
is a cache hit, as in a training loop; whole stacks are read with the default ``--stack-depth``
(64) and with a bound above the chain (all of it). Each figure is the minimum over ``--repeats`` of
the mean over ``--calls`` malloc/free pairs, minus the same loop calling a no-op (the loop's own
cost), in nanoseconds per malloc (the free's cost included; it captures nothing).

    PYTHONPATH=. python3 scripts/bench_stack_capture.py [--calls 20000] [--repeats 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from tracekit.record.callstacks import DEFAULT_DEPTH, live_stacks
from tracekit.record.hook import EventBuffer, TraceHook
from tracekit.record.sites import SiteTable, default_skip_dirs, site_roots

STREAM = types.SimpleNamespace(ptr=0x55D0_1234_5600)


def _hook(mode: str, depth: int) -> tuple[TraceHook, EventBuffer]:
    buf = EventBuffer()
    sites = SiteTable(default_skip_dirs(), site_roots(None)) if mode != "no_sites" else None
    stacks = live_stacks(sites, depth) if sites is not None and mode.startswith("stacks") else None
    return TraceHook(buf, sites=sites, stacks=stacks, current_stream=lambda: STREAM), buf


def _loop(hook: TraceHook, calls: int) -> float:
    malloc, free = hook.malloc_postprocess, hook.free_postprocess  # type: ignore[attr-defined]
    t0 = time.perf_counter_ns()
    for k in range(calls):
        malloc(device_id=0, size=1000, mem_size=1024, mem_ptr=0x7F00_0000_0000 + k * 1024, pmem_id=k)
        free(device_id=0, mem_size=1024, mem_ptr=0x7F00_0000_0000 + k * 1024, pmem_id=k)
    return (time.perf_counter_ns() - t0) / calls


def _noop_loop(calls: int) -> float:
    def malloc(**kw: int) -> None:
        return None

    free = malloc
    t0 = time.perf_counter_ns()
    for k in range(calls):
        malloc(device_id=0, size=1000, mem_size=1024, mem_ptr=0x7F00_0000_0000 + k * 1024, pmem_id=k)
        free(device_id=0, mem_size=1024, mem_ptr=0x7F00_0000_0000 + k * 1024, pmem_id=k)
    return (time.perf_counter_ns() - t0) / calls


def at_depth(depth: int, fn: Callable[[], float]) -> float:
    """``fn()`` run ``depth`` Python frames below this one."""
    if depth > 1:
        return at_depth(depth - 1, fn)
    return fn()


def measure(calls: int, repeats: int, depths: tuple[int, ...]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    base = sys._getframe()
    here = 0
    while base is not None:  # frames below the benchmark's own (the chain adds ``depth`` more)
        here, base = here + 1, base.f_back
    for depth in depths:
        row: dict[str, float] = {}
        chain = max(1, depth - here)
        noop = min(at_depth(chain, lambda: _noop_loop(calls)) for _ in range(repeats))
        modes = {"no_sites": 0, "site": 0, f"stacks_{DEFAULT_DEPTH}": DEFAULT_DEPTH, "stacks_all": depth + 8}
        for mode, limit in modes.items():
            times = []
            for _ in range(repeats):
                hook, buf = _hook(mode, limit)
                times.append(at_depth(chain, lambda hook=hook: _loop(hook, calls)))  # type: ignore[misc]
                buf.take()
            row[mode] = round(min(times) - noop, 1)
        row["stack_over_site"] = round(row[f"stacks_{DEFAULT_DEPTH}"] - row["site"], 1)
        out[str(depth)] = row
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    result = {
        "machine": platform.node(), "python": platform.python_version(), "cpu": platform.processor(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "calls": args.calls, "repeats": args.repeats,
        "ns_per_malloc": measure(args.calls, args.repeats, (10, 30, 100)),
    }
    for depth, row in result["ns_per_malloc"].items():  # type: ignore[attr-defined]
        print(f"depth {depth:>3}: " + "  ".join(f"{k} {v:.0f} ns" for k, v in row.items()))
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
