"""How many worker processes a search starts: the rule in tracekit.workers, worked by hand."""

from __future__ import annotations

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


def test_jobs_given_are_kept_but_never_more_than_the_tasks() -> None:
    assert default_jobs(3, tasks=7, events=10, replays=1) == 3
    assert default_jobs(16, tasks=7, events=10, replays=1) == 7
    assert default_jobs(2, tasks=0, events=10, replays=1) == 1
