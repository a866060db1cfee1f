"""The advise search: candidates replayed side by side in threads, the grid pruned, capacity bisected.

Stages (each one ``Runner.map`` over its threads, on the input the runner prepared once):

1. every single candidate at the limit (PyTorch: the defaults and each key alone; CuPy:
   its pool, ``free_all_blocks()`` at the failing call-site, the async pool, cudaMalloc;
   RMM: its pool, the async resource, no pool; raw traces: the registry's heap policies,
   ``registry.is_heap``);
2. PyTorch only: combinations of the keys whose best value did better alone than the
   defaults (fits, fails later, or peaks lower), ``candidates.combine_torch``;
3. bisection (``tracekit.advise.bisection``, 2 MiB steps from the live-bytes lower
   bound) of the smallest capacity: under the recommended candidate when one fits, else
   under the three that got furthest; for CuPy also the smallest ``set_limit``. Its replays
   go over the threads in rounds (``Runner.bisect``): with several, each round makes the replays
   of the next halvings too, whichever way they answer, so a search of ten halvings takes
   three or four rounds on 15 threads, with the answer of one replay at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from tracekit.advise import candidates as cands
from tracekit.advise.bisection import Probe, Same, Unbounded, alike
from tracekit.advise.candidates import Candidate, Kind
from tracekit.advise.capacity import PolicyFit, bisection_for, fit_of, probe
from tracekit.advise.evaluate import Outcome, evaluate, input_for
from tracekit.sim.base import Allocator
from tracekit.sim.scratch import WORK
from tracekit.trace.reader import Trace
from tracekit.workers import Pool

if TYPE_CHECKING:
    from tracekit.sim.policies.torch_caching import InertFacts


@dataclass(frozen=True)
class Task:
    """``evaluate`` the candidate at ``capacity``; (``bisect``) search its smallest capacity
    (``Runner.bisect``); (``probe``) one replay of such a search."""

    candidate: Candidate
    capacity: int | None
    device_total: int | None
    bisect: bool = False
    lower_bound: int = 0
    known: Unbounded | None = None  # bisect: the unbounded replay's figures, when already had
    seen: tuple[Same, ...] = ()  # bisect: replays of the setting already made (``capacity.same_of``)
    probe: bool = False  # one replay of a bisection at ``capacity`` (None: unbounded), no device total


def _input(trace: Trace, counterfactual: bool) -> Trace:
    """What the tasks replay: the counterfactual input of a recording, else the trace."""
    from tracekit.advise.counterfactual import prepare

    return prepare(trace) if counterfactual else trace


def _run(trace: Trace, counterfactual: bool, task: Task) -> Outcome | Probe:
    """``task`` on ``trace`` (the runner's input, prepared), in whichever thread runs it."""
    c = task.candidate
    assert not task.bisect, "a search's replays are probes (Runner.bisect)"
    try:
        if task.probe:
            assert c.policy is not None
            return probe(input_for(c, trace), c.policy, task.capacity, c.opts,
                         counterfactual=counterfactual and c.kind != Kind.FREE_LIST)
        return evaluate(c, trace, task.capacity, task.device_total)
    except Exception as e:  # one candidate failing must not hide the others' answers
        why = f"{type(e).__name__}: {e}"
        if task.probe:
            return Probe(task.capacity, True, 0, -1, (), error=why)
        return Outcome(c, task.capacity, False, 0, 0, 0, None, True, error=why)


class Runner:
    """``jobs`` threads over one trace (in this thread when ``jobs`` is 1: ``workers.Pool``). Every
    replay kernel lets the GIL go (``nogil``), so the settings replay side by side on the one
    input this process prepared, with no worker process to start and nothing copied or read
    again: on the 16-core host a 10M-event advise's 15 worker processes took 2.1 s to start and
    each set the trace up again before its first replay (docs/performance.md).

    A task is run once: a task equal to one run before, or one whose setting the model proves
    to replay as another's (``_same_as``), takes that one's answer instead of replaying.
    """

    def __init__(self, trace: Trace, jobs: int, counterfactual: bool) -> None:
        self.jobs = jobs
        self.trace = trace
        self.counterfactual = counterfactual
        self.done: dict[Task, Outcome | Probe] = {}
        self.pending: dict[Task, Future[Outcome | Probe]] = {}  # begun (``begin``), not yet asked for
        self.facts: InertFacts | None = None  # ``_same_as``'s reading of the trace, once
        self._run = partial(_run, _input(trace, counterfactual), counterfactual)  # prepared here, once
        self.pool = Pool(jobs)
        # The replays' work arrays, kept from one replay to the next until ``close``: a search's
        # replays then take no fresh memory after the first on each thread (``tracekit.sim.scratch``).
        self._keeping = ExitStack()
        self._keeping.enter_context(WORK.keeping())

    def map(self, tasks: Sequence[Task]) -> list[Outcome | Probe]:
        """Run ``tasks``, reporting each one done (a batch of tasks is one pass of the bar)."""
        same = [self._same_as(t) for t in tasks]
        todo = list(dict.fromkeys(t for t in same if t not in self.done and t not in self.pending))
        self.done.update(zip(todo, self.pool.map(self._run, todo), strict=True))
        for s in same:
            if s in self.pending:  # begun ahead: its answer, waited for only now
                self.done[s] = self.pending.pop(s).result()
        return [_as(self.done[s], t.candidate) for s, t in zip(same, tasks, strict=True)]

    def begin(self, tasks: Sequence[Task], at_most: int | None = None) -> None:
        """Start ``tasks`` (at most ``at_most`` replays not already run or begun, when given)
        without waiting for them: a later ``map`` or ``bisect`` that asks for one takes its answer,
        waiting only then; one never asked for holds back nothing. The same replays as ``map``
        would make, so the same answers. They start in the order given, except that those whose
        folding has the trace still to read (``_reads_trace``) come last. Nothing is started where
        the runner works in this thread."""
        if not self.pool.parallel(self.jobs):
            return
        # Those whose folding needs no reading of the trace (``_reads_trace``) start first: the
        # reading (``inert_facts``, 0.07 s at 10M events) then runs beside their replays.
        for t in sorted(tasks, key=self._reads_trace):
            if at_most is not None and at_most <= 0:
                break
            s = self._same_as(t)
            if s not in self.done and s not in self.pending:
                self.pending[s] = self.pool.start(self._run, s)
                at_most = None if at_most is None else at_most - 1

    def idle(self) -> int:
        """Threads that the tasks begun and not yet asked for leave idle (0 where the runner works
        in this thread)."""
        return max(0, self.jobs - len(self.pending)) if self.pool.parallel(self.jobs) else 0

    def bisect(self, tasks: Sequence[Task]) -> list[PolicyFit]:
        """The bisections ``tasks`` (``bisect_tasks``), their replays made in rounds by this runner:
        in a round each search asks for its next replay, and, where the round runs side by side
        (``Pool.parallel``), for the replays of its next halvings too, up to the threads it has
        (``tracekit.advise.bisection``: the answers are those of one replay at a time)."""
        searches = [bisection_for(t.lower_bound, t.device_total, t.known, t.seen) for t in tasks]
        while active := [i for i, b in enumerate(searches) if b.error is None and b.wanted()]:
            width = max(1, self.jobs // len(active))
            if not self.pool.parallel(len(active) * width):
                width = 1
            probes = [(i, Task(tasks[i].candidate, cap, None, probe=True))
                      for i in active for cap in searches[i].wanted(width)]
            for (i, _), got in zip(probes, self.map([t for _, t in probes]), strict=True):
                assert isinstance(got, Probe)
                searches[i].learn(got)
        out = []
        for t, b in zip(tasks, searches, strict=True):
            policy = t.candidate.policy or ""
            out.append(fit_of(b, policy) if b.error is None else
                       PolicyFit(policy, None, t.lower_bound, None, 0, 0, error=b.error))
        return out

    def _reads_trace(self, task: Task) -> bool:
        """Whether ``_same_as(task)`` has the trace still to read before it can answer."""
        return self.facts is None and self._may_fold(task)

    def _may_fold(self, task: Task) -> bool:
        """Whether ``task``'s setting may replay as another's (``_same_as``): a PyTorch setting of a
        recording with a key the model could ignore (``torch_caching.may_be_inert``)."""
        c = task.candidate
        if c.kind != Kind.TORCH_CONF or not self.counterfactual or not c.options:
            return False
        from tracekit.sim.policies.torch_caching import may_be_inert

        return may_be_inert(c.opts)

    def _same_as(self, task: Task) -> Task:
        """The task whose answer is ``task``'s: itself, or the same PyTorch setting less the keys
        the model ignores on this trace (``torch_caching.inert_keys``: the replays are alike step
        by step). The trace here is the one read: the counterfactual input drops only
        ``segment_free`` rows and the recorded settings, so its requests and starting state are
        these, and its setting is the candidate's options alone."""
        if not self._may_fold(task):
            return task  # no key the model could ignore: the trace need not be read
        from dataclasses import replace

        from tracekit.sim.policies.torch_caching import inert_facts, inert_keys

        c = task.candidate
        if self.facts is None:  # the trace's side, read once for every setting asked about
            self.facts = inert_facts(self.trace)
        drop = inert_keys(self.trace, c.opts, self.facts)
        if not drop:
            return task
        return replace(task, candidate=replace(c, options=tuple(kv for kv in c.options if kv[0] not in drop)))

    def close(self) -> None:
        self.pool.close()
        self._keeping.close()


def _as(result: Outcome | Probe, candidate: Candidate) -> Outcome | Probe:
    """``result`` as the answer for ``candidate`` (a bisection's answer names only the policy)."""
    if isinstance(result, Outcome) and result.candidate != candidate:
        from dataclasses import replace

        return replace(result, candidate=candidate)
    return result


def outcomes(results: Sequence[Outcome | Probe]) -> list[Outcome]:
    return [r for r in results if isinstance(r, Outcome)]


def best_values(single: Sequence[Outcome]) -> dict[str, list[str]]:
    """Per PyTorch key, its values that did better alone than the defaults, best first."""
    base = next((o for o in single if not o.candidate.options), None)
    out: dict[str, list[str]] = {}
    for o in sorted(single, key=Outcome.progress):
        if not o.candidate.options or o.error is not None:
            continue
        if base is not None and o.progress() >= base.progress():
            continue
        ((key, value),) = o.candidate.options
        out.setdefault(key, []).append(value)
    return out


def single_candidates(kind: str, site: str | None, policy_names: Sequence[str]) -> list[Candidate]:
    if kind == Allocator.TORCH:
        return cands.single_torch()
    if kind == Allocator.CUPY:
        return cands.cupy(site)
    if kind == Allocator.RMM_POOL:
        return cands.rmm()
    return cands.free_lists(policy_names)


def stage_two(kind: str, single: Sequence[Outcome]) -> list[Candidate]:
    return cands.combine_torch(best_values(single)) if kind == Allocator.TORCH else []


def _unbounded(o: Outcome, device_total: int | None) -> Unbounded | None:
    """What an unbounded replay of ``o``'s setting gives, when ``o``'s replay at its capacity was it
    step by step: it never asked for more than that capacity (``Stat.ASKED``), and the search
    replays under the same device (none: a bisection's replays give no device total)."""
    if device_total is not None or o.error is not None or o.capacity is None:
        return None
    if not 0 <= o.asked <= o.capacity:
        return None
    return o.peak_reserved, o.asked, not o.fits


def _seen(o: Outcome, device_total: int | None) -> tuple[Same, ...]:
    """``o``'s replay as the search's replays would make it (same input, setting, no device total):
    the capacities at which they would replay alike (``capacity.same_of``), when known."""
    lo, below = o.same
    if device_total is not None or o.error is not None or o.capacity is None:
        return ()
    return alike(lo, below, not o.fits, o.peak_reserved)


def bisect_tasks(kind: str, ranked: Sequence[Outcome], lb: int, device_total: int | None) -> list[Task]:
    """Stage 3 (see the module docstring); ``ranked``: replayed outcomes, recommendation first."""
    fit = [o for o in ranked if o.fits and o.verified_by_replay]
    picks = fit[:1] if fit else [o for o in ranked if o.verified_by_replay and o.error is None][:3]
    tasks = [Task(o.candidate, None, device_total, True, lb, _unbounded(o, device_total),
                  _seen(o, device_total)) for o in picks]
    if kind == Allocator.CUPY and not any(t.candidate.kind == Kind.CUPY_POOL for t in tasks):
        tasks.append(Task(cands.cupy_pool(), None, device_total, True, lb))
    return tasks
