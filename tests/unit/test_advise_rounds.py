"""Advise's runner (``tracekit.advise.search.Runner``) gives the answers of one thread however many
threads replay its settings and its bisections' rounds side by side."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tracekit.advise import candidates as cands
from tracekit.advise.capacity import lower_bound
from tracekit.advise.search import Runner, Task
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import Source

DATA = Path(__file__).resolve().parent / "data" / "advise_frozen"


@pytest.mark.parametrize("threads", [2, 4, 15])
def test_threads_answer_as_one(threads: int) -> None:
    t = read_trace(DATA / "synth-training-10k.parquet")
    t = replace(t, meta=replace(t.meta, source=Source.CUPY, pool_limit_bytes=None))
    limit = lower_bound(t) * 102 // 100 // 512 * 512
    singles = cands.cupy(None)
    searches = [Task(c, None, None, True, lower_bound(t)) for c in singles if c.policy is not None]

    def answers(r: Runner) -> tuple[object, ...]:
        ahead = [Task(c, None, None, probe=True) for c in singles if c.policy is not None]
        try:
            at_limit = [Task(c, limit, None) for c in singles]
            r.begin(at_limit)  # as advise does: begun, not waited for
            r.begin(ahead, at_most=r.idle())
            first = r.map(at_limit)
            fits = r.bisect(searches)
        finally:
            r.close()
        return (tuple((o.fits, o.peak_reserved) for o in first),  # type: ignore[union-attr]
                tuple((f.min_capacity, f.unbounded_peak_reserved, f.error) for f in fits))

    alone = answers(Runner(t, 1, counterfactual=True))
    # Four threads or more: those the singles leave idle replay the searches' starts ahead.
    assert answers(Runner(t, threads, counterfactual=True)) == alone
    assert all(f[0] is not None for f in alone[1])  # every search found a capacity


def test_a_task_begun_ahead_is_replayed_once_and_its_answer_taken() -> None:
    t = read_trace(DATA / "synth-training-10k.parquet")
    t = replace(t, meta=replace(t.meta, source=Source.CUPY, pool_limit_bytes=None))
    c = next(c for c in cands.cupy(None) if c.policy is not None)
    task = Task(c, None, None, probe=True)
    alone = Runner(t, 1, counterfactual=True)
    want = alone.map([task])
    alone.close()
    r = Runner(t, 2, counterfactual=True)
    ran: list[Task] = []
    run = r._run

    def counted(x: Task) -> object:
        ran.append(x)
        return run(x)

    r._run = counted  # type: ignore[method-assign]
    try:
        r.begin([task])
        assert task in r.pending
        assert r.map([task]) == want
        assert r.map([task]) == want  # asked again: the answer kept
    finally:
        r.close()
    assert ran == [task]
    assert not r.pending


def test_begin_starts_nothing_where_the_runner_works_in_its_own_thread() -> None:
    t = read_trace(DATA / "synth-training-10k.parquet")
    c = next(c for c in cands.cupy(None) if c.policy is not None)
    r = Runner(t, 1, counterfactual=True)
    r.begin([Task(c, None, None, probe=True)])
    assert not r.pending
    r.close()


def test_begin_at_most_counts_the_replays_it_starts() -> None:
    """``at_most`` bounds the replays started, not the tasks named: one already begun, or named
    twice, takes no thread; ``idle`` is the threads the begun tasks leave."""
    t = read_trace(DATA / "synth-training-10k.parquet")
    cs = [c for c in cands.cupy(None) if c.policy is not None]
    assert len(cs) >= 2
    r = Runner(t, 4, counterfactual=True)
    try:
        one, two = (Task(c, None, None, probe=True) for c in cs[:2])
        r.begin([one])
        assert r.idle() == 3
        r.begin([one, one, two], at_most=1)
        assert set(r.pending) == {one, two}
        assert r.idle() == 2
        r.map([one, two])
        assert r.idle() == 4
    finally:
        r.close()
