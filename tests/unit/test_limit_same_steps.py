"""What advise's bisections rest on in the models of CuPy's pool and of the device allocators
(``cuda``, ``cupy-async``; issue 45 item 4): the limit enters a replay only in its limit tests, so a
replay's ``Stat.ASKED``, ``Stat.SAME_FROM`` and ``Stat.SAME_BELOW`` name limits at which it
replays step by step alike, checked here by replaying at the ends of each range."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.advise.capacity import lower_bound, search
from tracekit.advise.counterfactual import counterfactual_replay, prepare
from tracekit.sim.base import SimConfig, Stat
from tracekit.sim.codes import NO_REFUSAL
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Source

DATA = Path(__file__).resolve().parent / "data" / "advise_frozen"
TRACES = Path(__file__).resolve().parents[2] / "traces"


@cache
def _prepared(name: str) -> Trace:
    t = read_trace(DATA / f"synth-{name}-10k.parquet")
    return prepare(replace(t, meta=replace(t.meta, source=Source.CUPY, pool_limit_bytes=None)))


POLICIES = ("cupy", "cupy-async", "cuda")


def _replay(t: Trace, cap: int | None, policy: str = "cupy"):  # type: ignore[no-untyped-def]
    return counterfactual_replay(t, policy, SimConfig(capacity=cap))[1]


def _steps(r) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    """Every step of a replay; of its fatal OOM, where it came (the free space the device models
    report at it is measured against the limit itself)."""
    run, oom = r.run, r.summary.oom
    return (run.addr.tolist(), run.status.tolist(), run.rows_op.tolist(), run.rows_addr.tolist(),
            run.rows_size.tolist(), run.rows_before.tolist(), None if oom is None else oom.seq,
            r.summary.oom_count, r.summary.peak_reserved_bytes)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
@settings(max_examples=8, deadline=None)
@given(ratio=st.floats(1.0, 1.3))
def test_a_replay_is_alike_where_it_says(policy: str, name: str, ratio: float) -> None:
    t = _prepared(name)
    cap = int(lower_bound(t) * ratio) // 512 * 512
    r, below = _alike_where_it_says(lambda c: _replay(t, c, policy), _steps, cap)
    if below < NO_REFUSAL:  # a test it refused: from that limit up the run is another
        assert r.run.stats[Stat.ASKED] >= below


def _alike_where_it_says(replay_at, steps, cap: int):  # type: ignore[no-untyped-def]
    """The replay at ``cap`` and its ``Stat.SAME_BELOW``, having replayed at its range's ends and
    middle (alike: the same ``steps``) and at the range's end (another run, where it has one)."""
    r = replay_at(cap)
    lo, below = int(r.run.stats[Stat.SAME_FROM]), int(r.run.stats[Stat.SAME_BELOW])
    assert 0 < lo <= cap < below
    for other in {lo, min(below - 1, 1 << 50), (lo + cap) // 2}:
        assert steps(replay_at(other)) == steps(r), other
    if below < NO_REFUSAL:
        assert steps(replay_at(below)) != steps(r)
    return r, below


def _unbounded_alike_from_asked(replay_at, steps):  # type: ignore[no-untyped-def]
    """The unbounded replay and its ``Stat.ASKED``, having checked that it says it is alike from
    there up (``SAME_FROM`` = ``ASKED``, nothing refused) and is, replayed at that capacity."""
    r = replay_at(None)
    asked = int(r.run.stats[Stat.ASKED])
    assert int(r.run.stats[Stat.SAME_FROM]) == asked
    assert int(r.run.stats[Stat.SAME_BELOW]) == NO_REFUSAL
    assert steps(replay_at(asked)) == steps(r)
    return r, asked


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
def test_an_unbounded_replay_is_alike_from_what_it_asked(policy: str, name: str) -> None:
    t = _prepared(name)
    r, asked = _unbounded_alike_from_asked(lambda c: _replay(t, c, policy), _steps)
    assert asked > 0
    assert _steps(_replay(t, asked - 512, policy)) != _steps(r)  # one test refused: another run


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", ["training", "fragmenting"])
def test_the_bisection_answers_as_without_the_ranges(policy: str, name: str) -> None:
    t = _prepared(name)
    lb = lower_bound(t)
    plain = search(t, policy, lb=lb, counterfactual=True)
    quick = search(t, policy, lb=lb, counterfactual=True, reuse=True)
    assert quick.min_capacity == plain.min_capacity
    assert quick.unbounded_peak_reserved == plain.unbounded_peak_reserved
    assert quick.replays < plain.replays


def test_a_recording_s_limit_tests_are_its_own() -> None:
    """A real CuPy recording with handled OOMs (``free_all_blocks`` retries): its replay at the
    recorded limit is alike at the ends of the range it names."""
    t = read_trace(TRACES / "cupy-oom-frag.parquet")
    p = prepare(t)
    cap = t.meta.pool_limit_bytes or lower_bound(p) * 11 // 10 // 512 * 512
    r = _replay(p, cap)
    lo, below = int(r.run.stats[Stat.SAME_FROM]), int(r.run.stats[Stat.SAME_BELOW])
    assert 0 < lo <= cap < below
    assert _steps(_replay(p, lo)) == _steps(r)
    assert _steps(_replay(p, min(below - 1, 1 << 50))) == _steps(r)


HEAPS = ("first-fit", "best-fit")


@cache
def _raw(name: str) -> Trace:
    return read_trace(DATA / f"synth-{name}-10k.parquet")


def _heap(t: Trace, cap: int | None, policy: str):  # type: ignore[no-untyped-def]
    from tracekit.sim.engine import replay

    return replay(t, policy, SimConfig(capacity=cap, alike=True))


def _placed(r) -> tuple[object, ...]:  # type: ignore[no-untyped-def]
    """A heap replay's steps: where each request went, what happened to each event, where it
    stopped, the highest end address (the heap's own row is its capacity and differs)."""
    run, oom = r.run, r.summary.oom
    return (run.addr.tolist(), run.status.tolist(), None if oom is None else oom.seq,
            r.summary.oom_count, int(run.stats[Stat.PEAK_EXTENT]))


@pytest.mark.parametrize("policy", HEAPS)
@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
@settings(max_examples=8, deadline=None)
@given(ratio=st.floats(0.98, 1.4))
def test_a_heap_replay_is_alike_where_it_says(policy: str, name: str, ratio: float) -> None:
    """The capacity enters a first- or best-fit heap only through its top free block: a replay
    says at which capacities each placement is the same (``_freelist_kernel._note_choice``)."""
    t = _raw(name)
    cap = int(lower_bound(t) * ratio) // 512 * 512
    # from SAME_BELOW up a placement is another (or a refused request is served)
    _alike_where_it_says(lambda c: _heap(t, c, policy), _placed, cap)


@pytest.mark.parametrize("policy", HEAPS)
@pytest.mark.parametrize("name", ["training", "random", "fragmenting"])
def test_an_unbounded_heap_is_alike_from_what_it_asked(policy: str, name: str) -> None:
    t = _raw(name)
    r, asked = _unbounded_alike_from_asked(lambda c: _heap(t, c, policy), _placed)
    assert asked >= int(r.run.stats[Stat.PEAK_EXTENT]) > 0
    if policy == "first-fit":  # first fit asks no more than its highest end address
        assert asked == int(r.run.stats[Stat.PEAK_EXTENT])


@pytest.mark.parametrize("policy", HEAPS)
@pytest.mark.parametrize("name", ["training", "fragmenting"])
def test_a_heap_bisection_answers_as_without_the_ranges(policy: str, name: str) -> None:
    t = _raw(name)
    lb = lower_bound(t)
    plain = search(t, policy, lb=lb)
    quick = search(t, policy, lb=lb, reuse=True)
    assert (quick.min_capacity, quick.unbounded_peak_reserved) == (plain.min_capacity,
                                                                    plain.unbounded_peak_reserved)
    assert quick.replays <= plain.replays


@pytest.mark.parametrize("policy", HEAPS)
def test_a_plain_heap_replay_does_not_say_nor_pay_for_it(policy: str) -> None:
    """``replay --sim`` asks nothing of the kind: the heap's stats say "not known" (-1) and its
    steps are those of a replay that says (the bookkeeping changes no placement)."""
    from tracekit.sim.engine import replay

    t = _raw("fragmenting")
    cap = int(lower_bound(t) * 1.1) // 512 * 512
    plain = replay(t, policy, SimConfig(capacity=cap))
    assert [int(plain.run.stats[k]) for k in (Stat.ASKED, Stat.SAME_FROM, Stat.SAME_BELOW)] == [-1, -1, -1]
    assert _placed(plain) == _placed(_heap(t, cap, policy))
