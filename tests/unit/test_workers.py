"""How many threads a search takes and how the one pool runs work: the rules in tracekit.workers,
worked by hand."""

from __future__ import annotations

import os

import pytest

from tracekit import workers
from tracekit.workers import BISECT_REPLAYS, EVENTS_PER_S, THREADS_FROM_S, default_threads, serial_seconds


def test_serial_estimate_is_replays_times_events_over_the_rate() -> None:
    assert serial_seconds(int(EVENTS_PER_S), 3) == pytest.approx(3.0)


def test_a_committed_size_trace_runs_in_this_thread(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    # whatif, 7 policies, 20k events: 7 x 12 x 20k / 15M/s = 0.11 s, under THREADS_FROM_S
    assert default_threads(None, tasks=7, events=20_000, replays=7 * BISECT_REPLAYS) == 1


def test_work_from_the_threshold_gets_one_thread_per_cpu_at_most_one_per_task(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    events = int(THREADS_FROM_S * EVENTS_PER_S)  # one replay alone is exactly at the threshold
    assert default_threads(None, tasks=7, events=events, replays=1) == 7
    assert default_threads(None, tasks=20, events=events, replays=1) == 8
    assert default_threads(None, tasks=20, events=events - 1, replays=1) == 1


def test_jobs_given_are_kept_but_never_more_than_the_tasks_or_the_cpus(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    assert default_threads(3, tasks=7, events=10, replays=1) == 3
    assert default_threads(16, tasks=7, events=10, replays=1) == 7
    assert default_threads(2, tasks=0, events=10, replays=1) == 1
    assert default_threads(16, tasks=20, events=10, replays=1) == 8
    assert default_threads(99_999_999_999, tasks=20, events=10, replays=1) == 8


def test_workers_are_capped_by_cpus_tasks_and_memory(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    monkeypatch.setattr(workers, "available_memory", lambda: 10 << 30)
    # --jobs 100 on 2 CPUs: 2 workers; 100 tasks of 4 GiB workers in 10 GiB: 2 either way
    assert workers.cap_workers(100, tasks=100, worker_bytes=1 << 30) == 2
    monkeypatch.setattr(workers, "usable_cpus", lambda: 64)
    assert workers.cap_workers(100, tasks=100, worker_bytes=1 << 30) == 10  # 10 GiB / 1 GiB
    assert workers.cap_workers(100, tasks=3, worker_bytes=1 << 30) == 3
    assert workers.cap_workers(100, tasks=100, worker_bytes=64 << 30) == 1  # one always runs
    monkeypatch.setattr(workers, "available_memory", lambda: None)  # unknown: CPUs and tasks only
    assert workers.cap_workers(100, tasks=100, worker_bytes=64 << 30) == 64


def test_peak_bytes_is_512_mib_plus_64_per_input_byte() -> None:
    assert workers.peak_bytes(0) == 512 << 20
    assert workers.peak_bytes(1 << 20) == (512 << 20) + (64 << 20)


def test_available_memory_is_known_on_linux_and_below_the_machine() -> None:
    avail = workers.available_memory()
    if avail is None:
        pytest.skip("no /proc/meminfo here")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 0 <= avail <= total


# The one worker pool: tasks at module level, so a worker process can import them.
def _die_on(k: int, x: int) -> int:
    """A task whose worker dies on ``x == k`` (as one killed for memory would)."""
    if x == k:
        os._exit(9)
    return x * 10


def test_each_fails_only_the_task_that_kills_its_worker_and_rebuilds_the_pool() -> None:
    with workers.Pool(2) as pool:
        got = dict(pool.each(_die_on, [(2, x) for x in range(6)], lambda i, e: f"died: {type(e).__name__}"))
        again = dict(pool.each(_die_on, [(-1, x) for x in range(3)], lambda i, e: "died"))
    # task 2 kills its worker every time; the tasks that shared the broken pool ran again and finished
    assert got == {0: 0, 1: 10, 2: "died: BrokenProcessPool", 3: 30, 4: 40, 5: 50}
    assert again == {0: 0, 1: 10, 2: 20}  # a later call gets a working pool


def test_workers_import_their_modules_and_the_fork_server_preload_is_left_alone() -> None:
    """``imports`` are imported by each worker; the process-wide forkserver preload is not changed."""
    import multiprocessing.forkserver as fs

    before = list(fs._forkserver._preload_modules)  # type: ignore[attr-defined]
    with workers.Pool(2, imports=["json.tool"]) as pool:
        loaded = dict(pool.each(_has_module, [("json.tool",), ("json.tool",)], lambda i, e: None))
    assert loaded == {0: True, 1: True}
    from tracekit.fleet.engines import LocalRunner

    fleet = LocalRunner(2)  # its workers import the analyzer's warm-up themselves
    try:
        warm = dict(fleet.map(_has_module, [("tracekit.fleet.preload",)] * 2, lambda i, e: None))
    finally:
        fleet.close()
    assert warm == {0: True, 1: True}
    assert fs._forkserver._preload_modules == before  # type: ignore[attr-defined]


def _has_module(name: str) -> bool:
    import sys

    return name in sys.modules


def test_threads_run_every_task_side_by_side_in_this_process() -> None:
    import threading

    seen: set[str] = set()

    def where(x: int) -> int:
        seen.add(threading.current_thread().name)
        return -x

    pool = workers.Pool(3)
    try:
        assert pool.parallel(2) and not pool.parallel(1)
        assert list(pool.map(where, range(40))) == [-x for x in range(40)]  # in order
    finally:
        pool.close()
    assert seen and all(name.startswith("tracekit-task") for name in seen)
    one = workers.Pool(1)
    assert not one.parallel(5) and list(one.map(abs, [-1, -2])) == [1, 2]


def test_closing_a_pool_of_threads_ends_its_running_tasks_at_their_next_check() -> None:
    """After a signal the command closes its pool: the tasks running stop at their next
    ``interrupts.check()`` (the end of a replay), the ones queued never start."""
    import threading
    import time

    from tracekit import interrupts

    running = threading.Barrier(3)
    ended: list[int] = []

    def task(x: int) -> int:
        running.wait(timeout=10)
        try:
            while True:
                interrupts.check()
                time.sleep(0.005)
        except interrupts.Cancelled:
            ended.append(x)
            raise

    submitted = threading.Event()

    class Tasks(list[int]):
        """The tasks, saying when the pool has taken the last (every one submitted)."""

        def __iter__(self):  # type: ignore[no-untyped-def]
            yield from list.__iter__(self)
            submitted.set()

    pool = workers.Pool(2)
    results = pool.map(task, Tasks([1, 2, 3]))
    got: list[BaseException] = []

    def consume() -> None:
        try:
            list(results)
        except BaseException as e:  # the first task's Cancelled, as the main thread would see it
            got.append(e)

    consumer = threading.Thread(target=consume)
    consumer.start()
    running.wait(timeout=10)  # both threads inside their tasks
    assert submitted.wait(timeout=10)  # and the third queued behind them
    t0 = time.monotonic()
    pool.close()
    consumer.join(timeout=10)
    while len(ended) < 2 and time.monotonic() - t0 < 10:  # the other thread's check comes soon after
        time.sleep(0.01)
    assert not consumer.is_alive() and time.monotonic() - t0 < 2
    assert isinstance(got[0], interrupts.Cancelled)
    time.sleep(0.1)
    assert sorted(ended) == [1, 2]  # task 3, queued, never ran
