"""Invariants of ``advise`` on random CuPy-like and raw request sequences (hypothesis).

Whatever the requests: every setting reported as fitting replays without running out at its
capacity, with peak reserved within it; the smallest capacity is never below the live-bytes
lower bound; a modelled setting (async pool, cudaMalloc) fits exactly when its live device
bytes fit; and the recommendation is the first of the ranked fits.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.advise.candidates import Kind
from tracekit.advise.run import advise
from tracekit.sim.base import SimConfig
from tracekit.sim.engine import fits
from tracekit.trace import Events, Op, Source, Trace, TraceMeta
from tracekit.trace.validate import pair_events

MIB = 1 << 20


def build(steps, source: Source, limit: int | None) -> Trace:
    """("m", MiB) allocates at call-site 0, ("f", k) frees the k-th live block."""
    op, size, addr = [], [], []
    live: list[int] = []
    nxt = 1
    for s in steps:
        if s[0] == "m" or not live:
            op.append(Op.MALLOC)
            size.append((s[1] if s[0] == "m" else 1) * MIB)
            addr.append(nxt)
            live.append(nxt)
            nxt += 1
        else:
            op.append(Op.FREE)
            size.append(0)
            addr.append(live.pop(s[1] % len(live)))
    ev = Events.build(np.array(op, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64),
                      rounded=np.array(size, np.uint64), site=np.zeros(len(op), np.int32),
                      sites=("job.py:1:step",))
    mate = pair_events(ev.op, ev.addr, ev.device, ev.seq).mate
    return Trace(None, TraceMeta.new(source, pool_limit_bytes=limit), ev, mate, None, ())


step = st.one_of(st.tuples(st.just("m"), st.integers(1, 6)), st.tuples(st.just("f"), st.integers(0, 50)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=30), limit_mib=st.integers(2, 24),
       source=st.sampled_from([Source.CUPY, Source.SYNTHETIC]))
def test_advise_invariants(steps, limit_mib, source):
    limit = limit_mib * MIB
    t = build(steps, source, limit)
    r = advise(t, limit=limit, jobs=1)
    for o in r.fits:
        assert o.capacity is not None and o.peak_reserved <= o.capacity
        if o.verified_by_replay and o.candidate.kind != Kind.CUPY_RELEASE:
            assert o.candidate.policy is not None
            assert fits(t, o.candidate.policy, SimConfig(capacity=o.capacity, options=o.candidate.opts))
        if o.candidate.kind != Kind.CUPY_LIMIT:
            assert o.capacity == limit
    for o in r.tried:
        if o.candidate.kind in (Kind.CUPY_ASYNC, Kind.CUDA_MALLOC):
            assert o.fits == (o.failed_at is None)
            assert o.fits or o.peak_reserved <= limit  # the peak before the failure stays within
    if r.min_capacity is not None:
        assert r.min_capacity >= r.lower_bound
    if r.fits:
        assert r.recommendation().startswith(r.fits[0].label())
    else:
        assert r.recommendation().startswith("Nothing tried fits")


@settings(max_examples=200, deadline=None)
@given(returns=st.lists(st.integers(1, 1000), min_size=0, max_size=8), deficit=st.integers(-5, 4000),
       own=st.lists(st.booleans(), min_size=8, max_size=8))
def test_smallest_set_of_cures(returns, deficit, own):
    """The pick covers the deficit with the fewest cures possible, and exists exactly when all do."""
    from itertools import combinations

    from tracekit.advise.candidates import Cure
    from tracekit.advise.overhead import How, smallest_set

    cures = [Cure(Kind.OTHER_PROCESS, f"c{i}", b * MIB, How.MEASURED, "", "", "", own=own[i])
             for i, b in enumerate(returns)]
    got = smallest_set(cures, deficit * MIB)
    if deficit <= 0:
        assert got == ()
        return
    if sum(returns) < deficit:
        assert got is None
        return
    assert got is not None and sum(c.returns for c in got) >= deficit * MIB
    fewer = [s for k in range(1, len(got)) for s in combinations(cures, k)]
    assert all(sum(c.returns for c in s) < deficit * MIB for s in fewer)
    assert [c.own for c in got] == sorted((c.own for c in got), reverse=True)  # own terms listed first
