"""The bisection of a policy's smallest capacity as a plan of replays ("probes"), so that one search
runs one replay at a time (``capacity.search``) or several at once (advise's threads), with the
same answer either way.

The search itself (``Bisection.walk``) is the one ``capacity.search`` documents: the unbounded
replay, the upper end doubled until it fits, then halving the interval between a capacity that
fails and one that fits, in ``step``s. Each replay it needs is looked up in the probes made so far;
the first one missing is what to replay next. Walking again from the start once it is there costs
nothing (a few lookups) and keeps the search exactly the sequential one.

``Bisection.wanted(width)`` names up to ``width`` probes to make together: the missing one and,
while halving, the capacities the halving reaches in the next levels whichever way each replay
answers (``width`` 3: two levels, 7: three). Replays made ahead that the walk does not reach are
spent CPU, never a different answer. A capacity some probe's replay is known to replay alike at
(``Stat.ASKED``, ``Stat.SAME_FROM`` to below ``Stat.SAME_BELOW``: ``capacity.same_of``) is
answered from it without a replay, as ``capacity.search`` does with ``reuse``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tracekit.trace.live import round_up

Same = tuple[int, int, bool]  # capacities [lo, below) a replay is alike at, and that none of them fits
Unbounded = tuple[int, int, bool]  # an unbounded replay: (peak reserved, its Stat.ASKED, ran out)


def alike(lo: int, below: int, ran_out: bool, peak: int) -> tuple[Same, ...]:
    """The capacities ``[lo, below)`` at which a replay replays alike (the same steps, so the same
    peak reserved ``peak``), with the answer the search reads there: where it ran out none of them
    fits; where it got through, those at or above its peak fit and those below it do not (the same
    steps reach the same peak, above such a capacity: expandable segments map whole pages past the
    limit test's request, so the headroom, and the verdict, would be negative). Empty: no such
    capacity is known."""
    if not 0 <= lo < below:
        return ()
    if ran_out:
        return ((lo, below, True),)
    cut = min(max(lo, peak), below)
    return tuple(r for r in ((lo, cut, True), (cut, below, False)) if r[0] < r[1])


@dataclass(frozen=True)
class Probe:
    """One replay of the searched setting: at ``capacity`` (None: unbounded)."""

    capacity: int | None
    ran_out: bool
    peak_reserved: int  # bytes
    asked: int  # its ``Stat.ASKED`` (-1: not known)
    same: tuple[Same, ...]  # where it replays alike, and its answer there (``capacity.same_of``)
    error: str | None = None  # the replay failed: "Type: message"


@dataclass(frozen=True)
class Found:
    """The walk's end: the smallest capacity (None: none up to ``limit``), the unbounded replay's
    peak reserved bytes, and the replays the sequential search makes for it."""

    min_capacity: int | None
    unbounded_peak_reserved: int
    replays: int


class _Missing(Exception):
    """The walk needs the replay at ``capacity`` (None: unbounded); halving between lo and hi."""

    def __init__(self, capacity: int | None, halving: tuple[int, int] | None) -> None:
        super().__init__(capacity)
        self.capacity, self.halving = capacity, halving


class _Failed(Exception):
    """The walk reached a replay that failed ("Type: message")."""

    def __init__(self, error: str) -> None:
        super().__init__(error)
        self.error = error


class Bisection:
    """One policy's search (see the module docstring): ``lb`` the lower bound (bytes), ``limit``
    where the doubling gives up, ``known`` the unbounded replay's figures where had, ``seen``
    ranges of replays of the setting made elsewhere, ``reuse`` (advise) answers from ranges."""

    def __init__(self, lb: int, step: int, limit: int, known: Unbounded | None = None,
                 seen: Sequence[Same] = (), reuse: bool = False) -> None:
        self.lb, self.step, self.limit, self.reuse = lb, step, limit, reuse
        self.known, self.seen = known, tuple(seen)
        self.probes: dict[int | None, Probe] = {}

    def learn(self, probe: Probe) -> None:
        """A replay made (by whoever made it)."""
        self.probes[probe.capacity] = probe

    @property
    def error(self) -> str | None:
        """The "Type: message" of a failed replay the walk reached: the search has no answer then
        (one made ahead that the walk does not reach is no answer of the search's)."""
        end = self.walk()
        return end.error if isinstance(end, _Failed) else None

    def walk(self) -> Found | _Missing | _Failed:
        """The search, every replay looked up: its answer, the first replay it lacks, or the
        failed replay it reached."""
        try:
            return self._walk()
        except (_Missing, _Failed) as stop:
            return stop

    def wanted(self, width: int = 1) -> list[int | None]:
        """Up to ``width`` capacities (None: unbounded) to replay next; empty once the walk ends."""
        end = self.walk()
        if not isinstance(end, _Missing):
            return []
        out: list[int | None] = [end.capacity]
        level = [end.halving] if end.halving is not None else []
        while level and len(out) < width:
            nxt: list[tuple[int, int]] = []
            for lo, hi in level:
                if hi - lo <= self.step:
                    continue
                mid = self._mid(lo, hi)
                if mid not in out and self._answer(mid, self._ranges()) is None and len(out) < width:
                    out.append(mid)
                nxt += [(lo, mid), (mid, hi)]
            level = nxt
        return out

    def _mid(self, lo: int, hi: int) -> int:
        return (lo + hi) // 2 // self.step * self.step

    def _ranges(self) -> list[Same]:
        return [*self.seen, *(r for p in self.probes.values() for r in p.same)]

    def _answer(self, cap: int, ranges: Sequence[Same]) -> bool | None:
        """Whether the setting fits at ``cap`` without a replay: from the unbounded replay (at or
        above what it asked) or a range some replay is alike in; None: a replay is needed."""
        if not self.reuse:
            return None
        unbounded = self._unbounded_or_none()
        if unbounded is not None and 0 <= unbounded[1] <= cap:
            return not unbounded[2] and unbounded[0] <= cap
        if cap > 0:
            alike = next((r for r in ranges if r[0] <= cap < r[1]), None)
            if alike is not None:
                return not alike[2]
        return None

    def _unbounded_or_none(self) -> Unbounded | None:
        if self.known is not None:
            return self.known
        p = self.probes.get(None)
        return None if p is None else (p.peak_reserved, p.asked, p.ran_out)

    def _walk(self) -> Found:
        """``capacity.search``'s loop, as it always ran it (its replay count included)."""
        step, skipped = self.step, 0
        runs = list(self.seen)  # the ranges of the walk's own replays, as the sequential search has them
        if self.known is None:
            first = self.probes.get(None)
            if first is None:
                raise _Missing(None, None)
            if first.error is not None:
                raise _Failed(first.error)
        else:
            skipped += 1
        unbounded = self._unbounded_or_none()
        assert unbounded is not None
        peak = unbounded[0]
        halving: tuple[int, int] | None = None

        def fits(cap: int) -> bool:
            nonlocal skipped
            answer = self._answer(cap, runs)
            if answer is not None:
                skipped += 1
                return answer
            p = self.probes.get(cap)
            if p is None:
                answer = self._answer(cap, self._ranges())  # a replay made ahead knows it
                if answer is not None:
                    return answer
                raise _Missing(cap, halving)
            if p.error is not None:  # one at a time, the search would have made it and failed
                raise _Failed(p.error)
            runs.extend(p.same)
            return not p.ran_out and p.peak_reserved <= cap  # a fit: got through, peak within it

        replays = 1
        lo = (self.lb - 1) // step * step if self.lb > 0 else -step  # the largest multiple below lb: fails
        hi = max(round_up(max(peak, 1), step), lo + step)
        while True:
            if hi > self.limit:
                hi = self.limit // step * step
                replays += 1
                if hi <= lo or not fits(hi):
                    return Found(None, peak, replays - skipped)
                break
            replays += 1
            if fits(hi):
                break
            lo, hi = hi, hi * 2
        while hi - lo > step:
            halving = (lo, hi)
            mid = self._mid(lo, hi)
            replays += 1
            if fits(mid):
                hi = mid
            else:
                lo = mid
        return Found(max(hi, 0), peak, replays - skipped)
