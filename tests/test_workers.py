"""How many worker processes a search starts: the rule in tracekit.workers, worked by hand."""

from __future__ import annotations

import os

import pytest

from tracekit import workers
from tracekit.workers import BISECT_REPLAYS, EVENTS_PER_S, START_S, default_jobs, serial_seconds


def test_serial_estimate_is_replays_times_events_over_the_rate() -> None:
    assert serial_seconds(int(EVENTS_PER_S), 3) == pytest.approx(3.0)


def test_a_committed_size_trace_runs_in_process(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    # whatif, 7 policies, 20k events: 7 x 12 x 20k / 15M/s = 0.11 s, well under 2 x START_S
    assert default_jobs(None, tasks=7, events=20_000, replays=7 * BISECT_REPLAYS) == 1


def test_large_work_gets_one_worker_per_cpu_at_most_one_per_task(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    events = int(2 * START_S * EVENTS_PER_S)  # one replay alone is exactly at the threshold
    assert default_jobs(None, tasks=7, events=events, replays=1) == 7
    assert default_jobs(None, tasks=20, events=events, replays=1) == 8
    assert default_jobs(None, tasks=20, events=events - 1, replays=1) == 1


def test_jobs_given_are_kept_but_never_more_than_the_tasks_or_the_cpus(monkeypatch) -> None:
    monkeypatch.setattr(workers, "usable_cpus", lambda: 8)
    assert default_jobs(3, tasks=7, events=10, replays=1) == 3
    assert default_jobs(16, tasks=7, events=10, replays=1) == 7
    assert default_jobs(2, tasks=0, events=10, replays=1) == 1
    assert default_jobs(16, tasks=20, events=10, replays=1) == 8
    assert default_jobs(99_999_999_999, tasks=20, events=10, replays=1) == 8


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
