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
from tracekit.advise.fidelity import Hints, compare_runs, recorded
from tracekit.sim.base import SimConfig
from tracekit.sim.engine import replay
from tracekit.trace import Op, read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"


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


# The runs recorded for this purpose on the H200 (traces/counterfactual/README.md): the PyTorch
# oom workload under each setting, and the CuPy oom workload under three set_limit values.
CF = TRACES / "counterfactual"
TORCH_RUNS = ("default-again", "expandable", "gc08-split256", "split128", "roundup4", "gc08", "split256",
              "roundup4-split128")
GOT_PAST = {"expandable", "gc08-split256", "split128", "roundup4-split128"}


@pytest.fixture(scope="module")
def torch_table():
    return compare_runs(CF / "torch-oom-default.parquet", [CF / f"torch-oom-{n}.parquet" for n in TORCH_RUNS])


def test_every_torch_setting_is_predicted_from_the_default_run(torch_table):
    rows = dict(zip(TORCH_RUNS, torch_table.rows, strict=True))
    for name, c in rows.items():
        assert c.same_requests and c.compared == 20_014, name
        # Which runs got past the default run's failing request, the prediction says exactly.
        assert c.real_got_past == c.predicted_got_past == (name in GOT_PAST), name
        if name != "gc08-split256":
            assert c.first_departure is None and c.agree == c.compared, name
            assert c.real_peak_reserved == c.predicted_peak_reserved, name
    # The one departure: the driver reused a freed address range, which no replay knows.
    assert rows["gc08-split256"].first_departure > 17_000


def test_hints_that_must_not_carry_over():
    """Recorded retry releases mislead every setting; invented addresses mislead max_split_size_mb."""
    runs = [CF / "torch-oom-expandable.parquet", CF / "torch-oom-split256.parquet"]
    base = CF / "torch-oom-default.parquet"
    everything = compare_runs(base, runs, Hints.ALL).rows
    assert everything[0].first_departure == 17_814  # where the default run released at its limit
    prepared = compare_runs(base, runs, Hints.PREPARED).rows
    assert prepared[0].first_departure is None
    assert prepared[1].first_departure is not None  # a new segment at an invented, too low address
    assert compare_runs(base, runs[1:]).rows[0].first_departure is None


def test_cupy_set_limit_runs_are_predicted_from_the_256_mib_run():
    base = CF / "cupy-oom-frag-256MiB.parquet"
    rows = compare_runs(base, [CF / f"cupy-oom-frag-{m}MiB.parquet" for m in (300, 308)]).rows
    assert all(c.first_departure is None and c.compared == 160 for c in rows)
    assert [c.real_got_past for c in rows] == [c.predicted_got_past for c in rows] == [False, True]
