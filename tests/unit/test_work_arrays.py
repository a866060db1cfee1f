"""The pool kernels' work arrays (``tracekit.sim.scratch``) and their per-event outputs turned off
(``SimConfig.per_event``): lent, kept only while advise's search runs, zeroed where asked, and the
same summaries, statistics and device rows as a replay with every output, on recorded traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.sim.base import SimConfig
from tracekit.sim.engine import replay
from tracekit.sim.scratch import Lender
from tracekit.trace.reader import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
MiB = 1 << 20


def test_an_array_given_back_is_lent_again_only_while_kept() -> None:
    work = Lender()
    a = work.take(1000, np.int8, zeroed=True)
    a[:] = 7
    work.give(a)  # no keeping open: dropped
    assert work.kept_bytes() == 0
    with work.keeping():
        b = work.take(1000, np.int8, zeroed=True)
        assert b is not a and not b.any()
        b[:] = 7
        work.give(b)
        assert work.kept_bytes() == 1000
        assert work.take(1001, np.int8, zeroed=True) is not b  # longer than any kept: fresh
        assert work.take(1000, np.int64, zeroed=False) is not b  # another type: fresh
        again = work.take(1000, np.int8, zeroed=True)
        assert again is b and not again.any()  # lent again, zeroed as asked
        work.give(again)
        dirty = work.take(1000, np.int8, zeroed=False)
        assert dirty is b  # not zeroed: whatever the last borrower left (here, zeros)
        work.give(dirty)
    assert work.kept_bytes() == 0  # the block's end drops every kept array


def test_a_longer_kept_array_lends_its_head_and_replaces_shorter_ones() -> None:
    """The replays of one search differ in length: a kept array lends its first n entries, the
    whole comes back, and an array given back replaces a shorter kept one (no pile of lengths)."""
    work = Lender()
    with work.keeping():
        long = work.take(100, np.int64, zeroed=False)
        work.give(long)
        head = work.take(90, np.int64, zeroed=True)
        assert len(head) == 90 and head.base is long and not head.any()
        work.give(head)
        assert work.kept_count() == 1 and work.kept_bytes() == 800
        longer = work.take(120, np.int64, zeroed=False)  # none long enough: fresh
        assert longer.base is None and len(longer) == 120
        work.give(longer)  # replaces the 100
        assert work.kept_count() == 1 and work.kept_bytes() == 960
        a, b = work.take(50, np.int64, zeroed=False), work.take(50, np.int64, zeroed=False)
        work.give(a, b)  # two lent at once: both kept (the 120 and a fresh 50)
        assert work.kept_count() == 2
        for n in range(10, 0, -1):  # one replay after another, each shorter: nothing new kept
            work.give(work.take(n, np.int64, zeroed=False))
        assert work.kept_count() == 2


def test_nested_keeping_keeps_until_the_outer_one_ends() -> None:
    work = Lender()
    with work.keeping():
        with work.keeping():
            work.give(work.take(10, np.int64, zeroed=False))
        assert work.kept_bytes() == 80
    assert work.kept_bytes() == 0


CASES = [
    ("torch-dcgan.parquet", "torch", {}),
    ("torch-dcgan.parquet", "torch", {"expandable_segments": "True"}),
    ("torch-dcgan.parquet", "torch", {"roundup_power2_divisions": "4"}),
    ("torch-expandable.parquet", "torch", {}),
    ("cupy-mlp.parquet", "cupy", {}),
    ("cupy-oom-frag.parquet", "cupy", {}),
]


@pytest.mark.parametrize(("name", "policy", "options"), CASES)
def test_a_summary_alone_is_the_whole_replays_summary(name: str, policy: str,
                                                      options: dict[str, str]) -> None:
    """The pool models with ``per_event`` off: no addresses, statuses or roundings, and the same
    summary, statistics and emitted device rows; again when every replay takes arrays an earlier
    one left dirty (inside ``WORK.keeping``, as advise's search runs them)."""
    from tracekit.sim.scratch import WORK

    trace = read_trace(TRACES / name)
    whole = replay(trace, policy, SimConfig(options=options))
    peak = whole.summary.peak_reserved_bytes
    for capacity in (None, peak, max(peak - 4 * MiB, MiB)):
        full = replay(trace, policy, SimConfig(capacity=capacity, options=options))
        assert len(full.run.addr) == len(full.run.status) == len(trace.events)
        with WORK.keeping():
            runs = [replay(trace, policy, SimConfig(capacity=c, options=options, per_event=False))
                    for c in (capacity, None, capacity)]
            assert WORK.kept_count() == 2  # the runs gave back their status and block arrays
        for alone in (runs[0], runs[2]):
            assert alone.summary == full.summary
            assert np.array_equal(alone.run.stats, full.run.stats)
            assert len(alone.run.addr) == len(alone.run.status) == 0
            for f in ("rows_before", "rows_op", "rows_addr", "rows_size", "rows_stream"):
                assert np.array_equal(getattr(alone.run, f), getattr(full.run, f)), f
    assert whole.summary == replay(trace, policy, SimConfig(options=options)).summary


def test_advise_keeps_nothing_once_it_has_answered() -> None:
    """advise's runner keeps the replays' arrays for its search only: none are held after it."""
    from tracekit.advise.run import advise
    from tracekit.sim.scratch import WORK

    advise(read_trace(TRACES / "torch-dcgan.parquet"), jobs=2)
    assert WORK.kept_count() == 0
