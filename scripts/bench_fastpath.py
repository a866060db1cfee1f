"""Nanoseconds per call of the recorder's fast path (``tracekit.record.fastpath``), C against Python.

The window hash at stack depths 10, 30 and 60 (the window is exactly that many frames: it stops at
the frame that starts the recursion), four ways:

* ``C``: ``_fastpath.window_hash(0, 64, stop)`` from a frame whose callers are all alive already
  (their frame objects exist: the steady state of a training loop's outer frames);
* ``C, 3 new frames``: the same through three Python frames made anew at each call, as a malloc
  from ``cupy.empty`` is (CPython makes their frame objects when the walk asks for them), less the
  same three calls ending in a no-op;
* ``pure``: the fallback ``py_window_hash`` (the tuple key of ``callstacks.window_key``, hashed);
* ``tuple key today``: what ``hook._stack_callbacks`` runs now: ``callstacks.window`` and the key
  tuple, looked up in a dict.

Then one 8-int row written: ``Ring.push`` (C and Python) against ``list.extend`` of a tuple (the
``EventBuffer`` row today). Each figure is the minimum over ``--repeats`` of the mean over
``--calls`` calls, less the cost of the empty loop, in ns.

    PYTHONPATH=. python3 scripts/bench_fastpath.py [--calls 100000] [--repeats 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Callable
from types import FrameType

from tracekit.record import fastpath
from tracekit.record.callstacks import backs, window, window_key

try:
    from tracekit.record import _fastpath as C
except ImportError:  # not built: the C columns say n/a
    C = None  # type: ignore[assignment]

DEPTHS = (10, 30, 60)


def _best(run: Callable[[int], float], calls: int, repeats: int) -> float:
    """Min over repeats of ``run(calls)`` (ns per call)."""
    run(min(calls, 1000))  # warm: specialisation, caches
    return min(run(calls) for _ in range(repeats))


def _empty(calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        pass
    return (time.perf_counter_ns() - t0) / calls


def _at_depth(depth: int, fn: Callable[[FrameType], float]) -> float:
    """``fn(stop)`` run so that the frames from ``fn``'s outwards to ``stop`` (left out) are ``depth``."""
    stop = sys._getframe()

    def down(k: int) -> float:
        return fn(stop) if k <= 1 else down(k - 1)

    return down(depth - 1)  # down's frames (depth - 1) and fn's own


def _hash_loop(h: Callable[[int, int, object], int]) -> Callable[[FrameType], Callable[[int], float]]:
    def make(stop: FrameType) -> Callable[[int], float]:
        def run(calls: int) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                h(0, 64, stop)
            return (time.perf_counter_ns() - t0) / calls
        return run
    return make


def _today_loop(stop: FrameType) -> Callable[[int], float]:
    """The tuple key as the hook builds it today (``callstacks.window`` + ``window_key`` + a lookup)."""
    from tracekit.record.callstacks import not_at

    steps, pred = backs(64), not_at(stop)
    hot: dict[tuple[int, ...], tuple[int | None, int]] = {}
    getframe = sys._getframe

    def run(calls: int) -> float:
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            hot.get(window_key(window(getframe(0), steps, pred)))
        return (time.perf_counter_ns() - t0) / calls
    return run


def _fresh_loop(h: Callable[[int, int, object], int] | None) -> Callable[[FrameType], Callable[[int], float]]:
    """Three new Python frames per call (a -> b -> c -> hash), or the same chain ending in a no-op."""
    def make(stop: FrameType) -> Callable[[int], float]:
        if h is None:
            def c() -> None:
                return None
        else:
            def c() -> None:
                h(0, 64, stop)

        def b() -> None:
            c()

        def a() -> None:
            b()

        def run(calls: int) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                a()
            return (time.perf_counter_ns() - t0) / calls
        return run
    return make


def window_rows(calls: int, repeats: int) -> list[dict[str, float | int | None]]:
    c_hash = C
    out: list[dict[str, float | int | None]] = []
    base = _best(_empty, calls, repeats)
    for depth in DEPTHS:
        def measure(make: Callable[[FrameType], Callable[[int], float]], d: int = depth) -> float:
            return _at_depth(d, lambda stop: _best(make(stop), calls, repeats)) - base

        row: dict[str, float | int | None] = {"depth": depth}
        if c_hash is not None:
            row["c"] = measure(_hash_loop(c_hash.window_hash))
            # The chain adds 3 frames: measured at depth - 3, so the window is still ``depth`` frames.
            fresh = _at_depth(depth - 3, lambda stop: _best(_fresh_loop(c_hash.window_hash)(stop), calls,
                                                            repeats))
            chain = _at_depth(depth - 3, lambda stop: _best(_fresh_loop(None)(stop), calls, repeats))
            row["c_3_new_frames"] = fresh - chain
        else:
            row["c"] = row["c_3_new_frames"] = None
        row["pure"] = measure(_hash_loop(fastpath.py_window_hash))
        row["tuple_key_today"] = measure(_today_loop)
        out.append(row)
    return out


def push_rows(calls: int, repeats: int) -> dict[str, float | None]:
    import mmap

    nslots = 1 << 16
    mm = mmap.mmap(-1, fastpath.ring_bytes(nslots))
    base = _best(_empty, calls, repeats)

    def ring_loop(ring: fastpath.RingWriter) -> Callable[[int], float]:
        push = ring.push

        def run(calls: int) -> float:
            t, c, a, s, r, st, d, k = 123456789012, 1 << 33, 0x7F00_0000_0000, 1000, 1024, 0x55D0, -1, 17
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                push(t, c, a, s, r, st, d, k)
            return (time.perf_counter_ns() - t0) / calls
        return run

    rows: list[int] = []

    def list_loop(calls: int) -> float:
        ext = rows.extend
        t, c, a, s, r, st, d, k = 123456789012, 1 << 33, 0x7F00_0000_0000, 1000, 1024, 0x55D0, -1, 17
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            ext((t, c, a, s, r, st, d, k))
        ns = (time.perf_counter_ns() - t0) / calls
        del rows[:]
        return ns

    out: dict[str, float | None] = {}
    if C is not None:
        ring = C.Ring(mm)
        out["ring_push_c"] = _best(ring_loop(ring), calls, repeats) - base
        ring.close()
    else:
        out["ring_push_c"] = None
    pyring = fastpath.PyRing(mm)
    out["ring_push_pure"] = _best(ring_loop(pyring), calls, repeats) - base
    pyring.close()
    out["list_extend"] = _best(list_loop, calls, repeats) - base
    mm.close()
    return out


def _fmt(v: float | int | None) -> str:
    return "n/a" if v is None else f"{v:.0f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    print(f"python {platform.python_version()} on {platform.machine()}, C extension built: "
          f"{C is not None}; ns per call, min of {args.repeats} "
          f"x {args.calls} calls, empty loop subtracted")
    wins = window_rows(args.calls, args.repeats)
    print()
    head = ("window depth", "C", "C, 3 new frames", "pure", "tuple key today")
    print(" | ".join(f"{h:>{w}}" for h, w in zip(head, (12, 6, 15, 6, 15), strict=True)))
    print("-" * 68)
    for r in wins:
        print(f"{r['depth']:>12} | {_fmt(r['c']):>6} | {_fmt(r['c_3_new_frames']):>15} | "
              f"{_fmt(r['pure']):>6} | {_fmt(r['tuple_key_today']):>15}")
    pushes = push_rows(args.calls, args.repeats)
    print()
    print(f"{'one 8-int row':>22} | {'ns':>6}")
    print("-" * 31)
    for name, label in (("ring_push_c", "Ring.push (C)"), ("ring_push_pure", "Ring.push (pure)"),
                        ("list_extend", "list.extend(8-tuple)")):
        print(f"{label:>22} | {_fmt(pushes[name]):>6}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"python": platform.python_version(), "window": wins, "push": pushes}, fh, indent=1)


if __name__ == "__main__":
    main()
