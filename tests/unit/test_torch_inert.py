"""Settings the PyTorch model provably ignores on a trace (``torch_caching.inert_keys``) replay step
by step as the setting without them, so advise's runner replays them once (``Runner._same_as``);
and a setting with no key that could be ignored is answered without reading the trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.advise import candidates as cands
from tracekit.advise.counterfactual import prepare
from tracekit.advise.search import Runner, Task
from tracekit.sim.base import SimConfig
from tracekit.sim.codes import Stat
from tracekit.sim.engine import replay
from tracekit.sim.policies.torch_caching import inert_keys, may_be_inert
from tracekit.trace.reader import Trace, read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
SETTINGS = [c.opts for c in cands.single_torch()] + [
    {"expandable_segments": "True", "garbage_collection_threshold": "0.6"},
    {"max_split_size_mb": "64", "roundup_power2_divisions": "4"},
    {"max_split_size_mb": "21", "garbage_collection_threshold": "0.8"},
]


def _steps(trace: Trace, options: dict[str, str]) -> tuple[object, ...]:
    """Every step and the whole summary; the statistics less the capacities a run is known alike at
    (a run with a GC threshold does not say them, ``_torch_kernel``; the steps are what is held)."""
    r = replay(trace, "torch", SimConfig(options=options))
    stats = r.run.stats.copy()
    stats[[Stat.ASKED, Stat.SAME_FROM, Stat.SAME_BELOW]] = 0
    return (r.run.status.tobytes(), r.run.addr.tobytes(), stats.tobytes(), r.summary)


@pytest.mark.parametrize("name", ["torch-train.parquet", "torch-maxsplit.parquet",
                                  "torch-expandable.parquet"])
def test_a_setting_less_its_inert_keys_replays_alike(name: str) -> None:
    t = prepare(read_trace(TRACES / name))
    dropped = 0
    for opts in SETTINGS:
        drop = inert_keys(t, opts)
        assert drop <= set(opts)  # (a too narrow may_be_inert is the table's below to catch)
        if drop:
            dropped += 1
            less = {k: v for k, v in opts.items() if k not in drop}
            assert _steps(t, opts) == _steps(t, less), (name, opts, drop)
    assert dropped, "no setting folded: the test would hold nothing"


def test_the_runner_reads_the_trace_only_for_a_setting_that_may_fold() -> None:
    t = read_trace(TRACES / "torch-train.parquet")
    r = Runner(t, 1, counterfactual=True)
    try:
        plain = [c for c in cands.single_torch() if not may_be_inert(c.opts)]
        assert any(c.options for c in plain)  # expandable segments, the roundings, the thresholds
        for c in plain:
            task = Task(c, None, None, probe=True)
            assert r._same_as(task) is task
        assert r.facts is None
        folding = next(c for c in cands.single_torch() if may_be_inert(c.opts))
        r._same_as(Task(folding, None, None, probe=True))
        assert r.facts is not None
    finally:
        r.close()


def test_may_be_inert_names_the_two_rules() -> None:
    assert may_be_inert({"max_split_size_mb": "64"})
    assert not may_be_inert({"max_split_size_mb": "64", "expandable_segments": "True"})
    assert may_be_inert({"garbage_collection_threshold": "0.6", "expandable_segments": "True"})
    assert not may_be_inert({"garbage_collection_threshold": "0.6"})
    assert not may_be_inert({"roundup_power2_divisions": "4"})
    assert not may_be_inert({})
    assert inert_keys(read_trace(TRACES / "torch-train.parquet"), {}) == frozenset()
