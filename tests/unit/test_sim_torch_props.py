"""Invariants of the ``torch`` caching-allocator model on random request sequences (hypothesis).

The same checks as for CuPy's pool (``test_sim_cupy_props``), over both
pools, several streams, with and without expandable segments and
max_split_size: no overlap, every block inside held device memory, a sound
chunk store after every prefix, and an OOM only when no cached block fits and
the per-process limit leaves no room for a new segment after releasing.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_cupy_props import build, check_outputs, trace_prefix

from tracekit.sim.base import SimConfig, Stat, Status
from tracekit.sim.chunk_check import check_state
from tracekit.sim.policies.torch_caching import MODEL
from tracekit.sim.torch_rules import segment_sizes

MIB = 1 << 20
sizes = st.one_of(st.integers(1, MIB), st.integers(MIB + 1, 12 * MIB), st.integers(20 * MIB, 60 * MIB),
                  st.sampled_from([512, 2 * MIB, 20 * MIB]))
step = st.one_of(st.tuples(st.just("m"), sizes, st.sampled_from([0, 0, 0, 5])),
                 st.tuples(st.just("f"), st.integers(0, 1000)), st.tuples(st.just("r")))
options = st.sampled_from([{}, {"expandable_segments": "True"}, {"max_split_size_mb": "40"},
                           {"roundup_power2_divisions": "4"}, {"garbage_collection_threshold": "0.5"}])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=50), opts=options,
       limit=st.one_of(st.none(), st.integers(2, 200).map(lambda m: m * MIB)))
def test_torch_invariants(steps, opts, limit):
    trace = build(steps)
    cfg = SimConfig(limit, None, True, opts)
    r, C, S = MODEL.run_with_state(trace, cfg)
    check_outputs(trace, r)
    assert check_state(C, S) == 0
    for cut in range(1, len(steps), 7):
        assert check_state(*MODEL.run_with_state(trace_prefix(trace, cut), cfg)[1:]) == 0
    if r.stats[Stat.OOMS] and "max_split_size_mb" not in opts:
        s = int(r.stats[Stat.OOM_ROUNDED])
        seg = int(segment_sizes(r.rounded[int(r.stats[Stat.FIRST_OOM]):][:1].astype("int64"))[0])
        assert r.stats[Stat.OOM_LARGEST] < s
        assert limit is not None and r.stats[Stat.OOM_RESERVED] + seg > limit
        assert r.status[int(r.stats[Stat.FIRST_OOM])] == Status.OOM
