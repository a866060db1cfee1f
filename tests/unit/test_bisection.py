"""The bisection as a plan of probes (``tracekit.advise.bisection``): made several at a time, its
answer is the one-at-a-time answer, whatever the replays say (fitting need not be monotone), in
fewer rounds; and its ranges answer without a replay only what a replay would have."""

from __future__ import annotations

import bisect as sorted_search

from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.advise.bisection import Bisection, Found, Probe, alike

STEP = 2 << 20
NO_REFUSAL = 1 << 62


class Oracle:
    """Replays of a setting whose steps change only at ``cuts`` (bytes): between two cuts every
    capacity replays alike, and ``out[k]`` says whether that run ran out (not monotone)."""

    def __init__(self, cuts: list[int], out: list[bool], peak: int, ranges: bool) -> None:
        self.cuts, self.out, self.peak, self.ranges = cuts, out, peak, ranges
        self.made = 0

    def __call__(self, cap: int | None) -> Probe:
        self.made += 1
        if cap is None or cap >= self.cuts[-1]:  # from the last cut up: the unbounded run
            same = ((self.cuts[-1], NO_REFUSAL, False),) if self.ranges else ()
            peak = self.peak if cap is None else min(self.peak, cap)
            return Probe(cap, False, peak, self.cuts[-1] if self.ranges else -1, same)
        k = sorted_search.bisect_right(self.cuts, cap) - 1
        lo = self.cuts[k] if k >= 0 else 1
        hi = self.cuts[k + 1]
        ran_out = self.out[k + 1]
        # a bounded replay's peak reserved stays within its capacity (the allocator's limit test)
        same = ((lo, hi, ran_out),) if self.ranges else ()
        return Probe(cap, ran_out, min(self.peak, cap), NO_REFUSAL, same)


def _run(b: Bisection, oracle: Oracle, width: int) -> tuple[Found, int]:
    rounds = 0
    while wanted := b.wanted(width):
        assert len(wanted) <= width and len(set(wanted)) == len(wanted)
        rounds += 1
        for cap in wanted:
            b.learn(oracle(cap))
    end = b.walk()
    assert isinstance(end, Found)
    return end, rounds


@st.composite
def oracles(draw: st.DrawFn) -> tuple[int, Oracle, Oracle]:
    lb_steps = draw(st.integers(1, 40))
    cuts = sorted(set(draw(st.lists(st.integers(1, 300), min_size=1, max_size=12))))
    cuts = [c * STEP // 3 + draw(st.integers(0, 4)) * 512 for c in cuts]
    cuts = sorted(set(cuts))
    out = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    out[-1] = False  # the unbounded run fits
    peak = cuts[-1] + draw(st.integers(0, 8)) * STEP
    ranges = draw(st.booleans())
    return lb_steps * STEP - draw(st.integers(0, 3)) * 512, Oracle(cuts, out, peak, ranges), \
        Oracle(cuts, out, peak, ranges)


@settings(max_examples=300, deadline=None)
@given(oracles(), st.sampled_from([2, 3, 7, 15, 40]), st.booleans(), st.booleans())
def test_several_at_once_answer_as_one_at_a_time(o: tuple[int, Oracle, Oracle], width: int,
                                                  reuse: bool, limited: bool) -> None:
    lb, one, many = o
    limit = (one.peak // 2) if limited else 1 << 50
    a, rounds_one = _run(Bisection(lb, STEP, limit, reuse=reuse), one, 1)
    b, rounds_many = _run(Bisection(lb, STEP, limit, reuse=reuse), many, width)
    assert b.min_capacity == a.min_capacity
    assert b.unbounded_peak_reserved == a.unbounded_peak_reserved
    assert rounds_many <= rounds_one
    # One at a time the count is the replays made, and one more where the limit is at or below
    # the largest failing capacity (counted as the search has always counted it, not replayed).
    assert a.replays == one.made or (limited and a.min_capacity is None and a.replays == one.made + 1)
    if width >= 7 and rounds_one >= 6:
        assert rounds_many < rounds_one


def test_a_worked_search() -> None:
    """Fits from 10 steps up, bound at 3 steps, the unbounded run peaks at 16 steps: the walk
    replays unbounded, then 8 (fails), 12, 10 (fit), 9 (fails): 10 steps, five replays; with
    seven at a time, two rounds: the unbounded run, then 8, 12, 4 (or 6), 10, 14, ...."""
    cuts = [10 * STEP]
    one = Oracle(cuts, [True, False], 16 * STEP, False)
    end, rounds = _run(Bisection(3 * STEP, STEP, 1 << 50), one, 1)
    assert (end.min_capacity, end.replays, rounds) == (10 * STEP, 5, 5)
    many = Oracle(cuts, [True, False], 16 * STEP, False)
    end7, rounds7 = _run(Bisection(3 * STEP, STEP, 1 << 50), many, 7)
    assert end7.min_capacity == 10 * STEP
    assert rounds7 == 3  # unbounded; three levels (8, 12, 10); the last (9)


def test_a_replay_made_ahead_that_failed_is_not_the_search_s_failure() -> None:
    """One capacity's replay fails (an error, not an OOM): one at a time the search never makes
    it, so several at a time its failure must not end the search either."""

    class Failing(Oracle):
        def __call__(self, cap: int | None) -> Probe:
            if cap == 7 * STEP:
                self.made += 1
                return Probe(cap, True, 0, -1, (), error="ValueError: boom")
            return super().__call__(cap)

    one = Failing([10 * STEP], [True, False], 16 * STEP, False)
    end, _ = _run(Bisection(3 * STEP, STEP, 1 << 50), one, 1)
    many = Failing([10 * STEP], [True, False], 16 * STEP, False)
    b = Bisection(3 * STEP, STEP, 1 << 50)
    end7, _ = _run(b, many, 7)
    assert 7 * STEP in b.probes and b.error is None  # made ahead, not on the path
    assert end7.min_capacity == end.min_capacity == 10 * STEP
    reached = Bisection(3 * STEP, STEP, 1 << 50)  # a failure on the path ends the search
    reached.learn(Probe(None, False, 16 * STEP, -1, ()))
    reached.learn(Probe(16 * STEP, False, 16 * STEP, -1, ()))  # the upper end fits
    reached.learn(Probe(9 * STEP, True, 0, -1, (), error="ValueError: boom"))
    assert reached.error == "ValueError: boom" and reached.wanted(7) == []


def test_a_replay_that_gets_through_above_its_capacity_is_no_fit() -> None:
    """Expandable segments map whole pages past the limit test's request: a replay at 10 steps that
    gets through at a peak of 11 is no fit there (its headroom, and verdict, would be negative), so
    the smallest capacity is the first whose replay's peak is within it; a range such a replay is
    alike in answers "no fit" below its peak and "fits" from its peak up."""
    class Overshoot(Oracle):
        def __call__(self, cap: int | None) -> Probe:
            self.made += 1
            if cap is None or cap >= 10 * STEP:  # from 10 steps up: the same steps, peak 11 steps
                return Probe(cap, False, 11 * STEP, 10 * STEP, alike(10 * STEP, NO_REFUSAL, False, 11 * STEP))
            return Probe(cap, True, cap, NO_REFUSAL, ())

    for width in (1, 7):
        end, _ = _run(Bisection(3 * STEP, STEP, 1 << 50, reuse=True), Overshoot([10 * STEP], [True, False],
                                                                                 11 * STEP, True), width)
        assert end.min_capacity == 11 * STEP


def test_a_replay_alike_below_its_peak_answers_no_fit_there() -> None:
    """A replay made elsewhere got through at a peak of 12 steps and is alike from 9 steps to 20: at
    9, 10 and 11 steps the same steps reach the same peak, above the capacity, so none fits there and
    none is replayed. Fits from 12 steps; the walk replays only 7 steps (lo 2, hi 12: 7, 9, 10, 11)."""
    seen = alike(9 * STEP, 20 * STEP, False, 12 * STEP)
    assert seen == ((9 * STEP, 12 * STEP, True), (12 * STEP, 20 * STEP, False))
    b = Bisection(3 * STEP, STEP, 1 << 50, known=(12 * STEP, 20 * STEP, False), seen=seen, reuse=True)
    replayed = []
    while wanted := b.wanted(1):
        replayed += wanted
        b.learn(Probe(wanted[0], True, wanted[0], NO_REFUSAL, ()))  # below 12 steps: runs out
    end = b.walk()
    assert isinstance(end, Found) and end.min_capacity == 12 * STEP
    assert replayed == [7 * STEP]
    assert alike(9 * STEP, 20 * STEP, True, 12 * STEP) == ((9 * STEP, 20 * STEP, True),)
    assert alike(13 * STEP, 20 * STEP, False, 12 * STEP) == ((13 * STEP, 20 * STEP, False),)
    assert alike(9 * STEP, 11 * STEP, False, 12 * STEP) == ((9 * STEP, 11 * STEP, True),)
    assert alike(-1, 20 * STEP, False, 12 * STEP) == ()


class Overshooting:
    """Replays whose steps change only at ``cuts``, each stretch with its own answer and peak, the
    peak possibly above the capacity (expandable segments' pages); ranges as ``alike`` cuts them."""

    def __init__(self, cuts: list[int], out: list[bool], peaks: list[int]) -> None:
        self.cuts, self.out, self.peaks = cuts, out, peaks

    def __call__(self, cap: int | None) -> Probe:
        if cap is None or cap >= self.cuts[-1]:
            peak = self.peaks[-1]
            return Probe(cap, False, peak, self.cuts[-1], alike(self.cuts[-1], NO_REFUSAL, False, peak))
        k = sorted_search.bisect_right(self.cuts, cap) - 1
        lo = self.cuts[k] if k >= 0 else 1
        ran_out, peak = self.out[k + 1], self.peaks[k + 1]
        return Probe(cap, ran_out, peak, NO_REFUSAL, alike(lo, self.cuts[k + 1], ran_out, peak))


@st.composite
def overshooting(draw: st.DrawFn) -> tuple[int, list[int], list[bool], list[int]]:
    cuts = sorted({c * STEP // 3 + draw(st.integers(0, 4)) * 512
                   for c in draw(st.lists(st.integers(1, 300), min_size=1, max_size=12))})
    out = draw(st.lists(st.booleans(), min_size=len(cuts) + 1, max_size=len(cuts) + 1))
    out[-1] = False
    peaks = [max(1, (cuts[k - 1] if k else 1) + draw(st.integers(-2, 6)) * STEP // 2
                 + draw(st.integers(0, 3)) * 512) for k in range(len(cuts) + 1)]
    return draw(st.integers(1, 40)) * STEP - draw(st.integers(0, 3)) * 512, cuts, out, peaks


@settings(max_examples=300, deadline=None)
@given(overshooting(), st.sampled_from([1, 3, 7, 15]), st.booleans())
def test_peaks_above_the_capacity_answer_as_replays_would(s: tuple[int, list[int], list[bool], list[int]],
                                                          width: int, limited: bool) -> None:
    """With peaks above their capacity, answers taken from ranges and from the unbounded replay are
    those a replay at each capacity gives: the search without reuse, one at a time, is the truth."""
    lb, cuts, out, peaks = s
    limit = peaks[-1] // 2 if limited else 1 << 50
    truth, _ = _run(Bisection(lb, STEP, limit), Overshooting(cuts, out, peaks), 1)
    for reuse in (False, True):
        got, _ = _run(Bisection(lb, STEP, limit, reuse=reuse), Overshooting(cuts, out, peaks), width)
        assert got.min_capacity == truth.min_capacity
