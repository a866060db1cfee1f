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
            first = r.map([Task(c, limit, None) for c in singles] + ahead[:r.idle_beside(len(singles))])
            fits = r.bisect(searches)
        finally:
            r.close()
        first = first[:len(singles)]  # the replays made ahead are the runner's, for the searches
        return (tuple((o.fits, o.peak_reserved) for o in first),  # type: ignore[union-attr]
                tuple((f.min_capacity, f.unbounded_peak_reserved, f.error) for f in fits))

    alone = answers(Runner(t, 1, counterfactual=True))
    # Four threads or more: those the singles leave idle replay the searches' starts ahead.
    assert answers(Runner(t, threads, counterfactual=True)) == alone
    assert all(f[0] is not None for f in alone[1])  # every search found a capacity
