"""``tracekit.sim.trace_cache.TraceCache``: made once per trace however many threads ask at once,
threads on different traces not held back by each other, the least recently used dropped first,
and nothing kept past its trace."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from pathlib import Path

from tracekit.sim.trace_cache import TraceCache
from tracekit.trace.reader import Trace, read_trace

_READ = read_trace(Path(__file__).resolve().parents[2] / "traces" / "cupy-oom-frag.parquet")


def _trace() -> Trace:
    """A trace object of its own (the cache tells traces apart by identity)."""
    return dataclasses.replace(_READ)


def test_threads_asking_at_once_wait_for_one_make() -> None:
    cache: TraceCache[int] = TraceCache()
    t = _trace()
    made: list[int] = []

    def make(_: Trace) -> int:
        made.append(1)
        time.sleep(0.05)  # long enough that every thread asks while it is being made
        return 42

    got: list[int] = []
    threads = [threading.Thread(target=lambda: got.append(cache.get(t, make))) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == [42] * 8 and made == [1]


def test_a_trace_being_made_does_not_hold_back_another() -> None:
    cache: TraceCache[str] = TraceCache()
    slow, fast = _trace(), _trace()
    release = threading.Event()

    def make_slow(_: Trace) -> str:
        release.wait(timeout=10)
        return "slow"

    th = threading.Thread(target=lambda: cache.get(slow, make_slow))
    th.start()
    time.sleep(0.02)  # the slow one is being made now
    assert cache.get(fast, lambda _: "fast") == "fast"  # answered while the other waits
    release.set()
    th.join()
    assert cache.get(slow, lambda _: "again") == "slow"


def test_keep_drops_the_least_recently_used_and_nothing_outlives_its_trace() -> None:
    cache: TraceCache[int] = TraceCache(keep=2)
    shared, a, b = _trace(), _trace(), _trace()
    assert cache.get(shared, lambda _: 0) == 0
    assert cache.get(a, lambda _: 1) == 1
    assert cache.get(shared, lambda _: -1) == 0  # used again: now the most recent
    assert cache.get(b, lambda _: 2) == 2  # drops a, not shared
    assert cache.get(shared, lambda _: -1) == 0 and cache.get(a, lambda _: 3) == 3  # a made again
    del a, b
    gc.collect()
    assert len(cache) == 1  # the traces gone, their values with them
