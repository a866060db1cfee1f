"""Counterfactual replay: predicting a run under one setting from a recording under another.

The committed PyTorch snapshots ``torch-train`` (defaults), ``torch-tuned``
(``roundup_power2_divisions:4,max_split_size_mb:128``) and ``torch-expandable``
(``expandable_segments:True``, with ``empty_cache()`` after step 8) ran the same program
on the H200, so each of the two others can be predicted from ``torch-train`` and checked
request by request. ``torch-oom`` shows the release the allocator made itself, at the limit.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.advise.counterfactual import internal_releases, prepare, with_release_before
from tracekit.advise.fidelity import compare_runs, recorded
from tracekit.sim.base import SimConfig
from tracekit.sim.engine import replay
from tracekit.trace import Op, read_trace

TRACES = Path(__file__).resolve().parent.parent / "traces"


@pytest.fixture(scope="module")
def table():
    return compare_runs(TRACES / "torch-train.parquet",
                        [TRACES / "torch-tuned.parquet", TRACES / "torch-expandable.parquet"])


def test_tuned_run_is_predicted_exactly_from_the_default_run(table):
    tuned = table.rows[0]
    assert tuned.same_requests and tuned.compared == 17_844
    assert tuned.agree == tuned.compared and tuned.first_departure is None
    assert tuned.real_peak_reserved == tuned.predicted_peak_reserved


def test_expandable_run_departs_only_where_the_program_released_memory(table):
    """The default run has no empty_cache(); the expandable run has: the only departure is there."""
    exp = table.rows[1]
    assert exp.same_requests and exp.first_departure is not None
    run = read_trace(TRACES / "torch-expandable.parquet")
    req = recorded(run)
    ev = run.events
    first_release = int(np.flatnonzero(ev.op == Op.SEGMENT_FREE)[0])
    # The departure is the first request after the program's first release.
    assert int(req.row[exp.first_departure - 1]) < first_release < int(req.row[exp.first_departure])


def test_releases_at_the_limit_are_the_allocators_own():
    t = read_trace(TRACES / "torch-oom.parquet")
    drop = internal_releases(t, t.meta.pool_limit_bytes)
    assert drop.sum() == int((t.events.op == Op.SEGMENT_FREE).sum()) == 52
    # Without them the model makes the same releases itself: the same device history and failure.
    p = prepare(t)
    own = replay(t, "torch", SimConfig(t.meta.pool_limit_bytes)).summary
    pred = replay(p, "torch", SimConfig(t.meta.pool_limit_bytes)).summary
    assert (pred.segment_allocs, pred.segment_frees, pred.oom.seq) == (own.segment_allocs, own.segment_frees,
                                                                         own.oom.seq)


def test_program_releases_are_kept():
    t = read_trace(TRACES / "torch-expandable.parquet")
    assert not internal_releases(t, t.meta.pool_limit_bytes).any()


def test_with_release_before_inserts_rows_and_keeps_pairs():
    t = read_trace(TRACES / "cupy-oom-frag.parquet")
    rows = np.flatnonzero(t.events.op == Op.MALLOC)[:5]
    out = with_release_before(t, rows)
    assert len(out.events) == len(t.events) + 5
    new = np.flatnonzero(out.events.op == Op.SEGMENT_FREE)
    assert len(new) == 5 and (out.events.size[new] == 0).all()
    assert (out.events.op[new + 1] == Op.MALLOC).all()
    m = np.flatnonzero(out.mate >= 0)
    assert (out.events.addr[m] == out.events.addr[out.mate[m]]).all()
