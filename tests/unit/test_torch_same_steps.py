"""What advise's speed rests on in the ``torch`` model (issue 45 item 4): the compiled rounding is
``torch_rules.round_size``, and a replay's ``Stat.SAME_FROM`` / ``Stat.SAME_BELOW`` name
capacities at which it replays step by step alike, so a bisection may take its answer there."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.advise.capacity import lower_bound, search
from tracekit.advise.counterfactual import counterfactual_replay, prepare
from tracekit.sim.base import SimConfig, Stat
from tracekit.sim.codes import NO_REFUSAL
from tracekit.sim.policies._torch_kernel import round_sizes as compiled
from tracekit.sim.torch_rules import round_size
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Source

DATA = Path(__file__).resolve().parent / "data" / "advise_frozen"
near_pow2 = st.builds(lambda k, off: max(0, min((1 << k) + off, (1 << 63) - 1)),
                      st.integers(0, 63), st.integers(-1024, 1024))
sizes = st.one_of(st.integers(0, (1 << 63) - 1), st.integers(0, 1 << 34), near_pow2)
tables = st.lists(st.sampled_from([0, 1, 2, 3, 4, 8, 16, 1 << 20, 1 << 32]), min_size=16, max_size=16)


@given(st.lists(sizes, min_size=1, max_size=64), tables)
def test_compiled_rounding_is_round_size(xs: list[int], d: list[int]) -> None:
    s = np.array(xs, np.int64)
    s.flags.writeable = False  # as the policy passes it (a read-only column)
    div = np.array(d, np.uint64)
    assert compiled(s, div).tolist() == round_size(s.astype(np.uint64), div).astype(np.int64).tolist()


@cache
def _prepared(name: str) -> Trace:
    from dataclasses import replace

    t = read_trace(DATA / f"synth-{name}-10k.parquet")
    return prepare(replace(t, meta=replace(t.meta, source=Source.TORCH)))


SETTINGS = ({}, {"expandable_segments": "True"}, {"max_split_size_mb": "64"},
            {"roundup_power2_divisions": "4"})


def _replay(t: Trace, cap: int | None, opts: dict[str, str]):  # type: ignore[no-untyped-def]
    return counterfactual_replay(t, "torch", SimConfig(capacity=cap, options=opts))[1]


def _steps(r) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    run = r.run
    return (run.addr.tolist(), run.status.tolist(), run.rows_op.tolist(), run.rows_addr.tolist(),
            run.rows_size.tolist(), run.rows_before.tolist(), r.summary.oom, r.summary.peak_reserved_bytes)


@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
@pytest.mark.parametrize("opts", SETTINGS, ids=lambda o: ",".join(o) or "defaults")
@settings(max_examples=6, deadline=None)
@given(ratio=st.floats(1.0, 1.3))
def test_a_replay_is_alike_where_it_says(name: str, opts: dict[str, str], ratio: float) -> None:
    t = _prepared(name)
    cap = int(lower_bound(t) * ratio) // 512 * 512
    r = _replay(t, cap, opts)
    lo, below = int(r.run.stats[Stat.SAME_FROM]), int(r.run.stats[Stat.SAME_BELOW])
    assert 0 <= lo <= cap < below
    for other in {lo, min(below - 1, 1 << 50), (lo + cap) // 2} - {0}:
        assert _steps(_replay(t, other, opts)) == _steps(r), other
    if below < NO_REFUSAL:  # a test it refused: at that capacity it would pass, so the run is another
        assert r.run.stats[Stat.ASKED] >= below


def test_an_unbounded_replay_is_alike_from_what_it_asked() -> None:
    r = _replay(_prepared("training"), None, {})
    assert int(r.run.stats[Stat.SAME_FROM]) == int(r.run.stats[Stat.ASKED]) > 0
    assert int(r.run.stats[Stat.SAME_BELOW]) == NO_REFUSAL


def test_a_garbage_collection_threshold_says_nothing() -> None:
    r = _replay(_prepared("training"), 1 << 40, {"garbage_collection_threshold": "0.6"})
    assert int(r.run.stats[Stat.SAME_FROM]) == int(r.run.stats[Stat.SAME_BELOW]) == -1


@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
@pytest.mark.parametrize("opts", SETTINGS, ids=lambda o: ",".join(o) or "defaults")
def test_reusing_replays_changes_no_bisection(name: str, opts: dict[str, str]) -> None:
    t = _prepared(name)
    plain = search(t, "torch", options=opts, counterfactual=True)
    reused = search(t, "torch", options=opts, counterfactual=True, reuse=True)
    assert reused.min_capacity == plain.min_capacity
    assert reused.replays <= plain.replays
