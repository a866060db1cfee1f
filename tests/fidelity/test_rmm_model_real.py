"""The ``rmm-pool`` model against RMM's real ``PoolMemoryResource``, no GPU needed.

``traces/fidelity/rmm.json`` holds what RMM 26.10's own pool did on an H100
(``scripts/gpu_rmm_fidelity.py``) with the allocation logs of two real programs
(``traces/rmm-cupy.dev0.csv``: a CuPy program on RMM's allocator; ``traces/rmm-torch.dev0.csv``: a
PyTorch network on RMM's allocator), at 7 maximum pool sizes each, with an initial pool of 0 and of
the whole maximum. The model must fail at the same event as the real pool (or not at all) and reach
the same peak pool size, byte for byte. The points where the pool is full and must give its free
upstream blocks back (``reclaim_free_blocks``) are among them: a model without the reclaim fails at
event 757 where RMM's pool failed at 776, and at 2,797 where it did not fail.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.sim.base import SimConfig
from tracekit.sim.codes import Stat
from tracekit.sim.policies.rmm_pool import MODEL
from tracekit.trace import Trace, read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
FIDELITY = json.loads((TRACES / "fidelity" / "rmm.json").read_text())
POINTS = [(p["name"], q) for p in FIDELITY["programs"] for q in p["points"]]


@pytest.fixture(scope="module")
def traces(rmm_fidelity_traces: dict[str, Path]) -> dict[str, Trace]:
    return {name: read_trace(path) for name, path in rmm_fidelity_traces.items()}


def test_the_record_holds_both_programs_and_both_initial_pools() -> None:
    assert {p["name"] for p in FIDELITY["programs"]} == {"cupy", "torch"}
    assert {q["initial_bytes"] == 0 for _, q in POINTS} == {True, False}
    assert any(q["device_first_oom"] is not None for _, q in POINTS)
    assert any(q["device_first_oom"] is None for _, q in POINTS)


@pytest.mark.parametrize(("program", "point"), POINTS,
                         ids=[f"{n}-max{q['maximum_bytes']}-init{q['initial_bytes']}" for n, q in POINTS])
def test_the_model_fails_where_rmms_pool_failed_with_its_peak(traces: dict[str, Trace], program: str,
                                                              point: dict[str, int | None]) -> None:
    run = MODEL.run(traces[program], SimConfig(capacity=point["maximum_bytes"],
                                               options={"initial_pool_size": str(point["initial_bytes"])}))
    first = int(run.stats[Stat.FIRST_OOM])
    assert (first if first >= 0 else None) == point["device_first_oom"]
    assert int(run.stats[Stat.PEAK_RESERVED]) == point["device_peak_pool_bytes"]


def test_the_bisected_smallest_maximum_is_rmms() -> None:
    for p in FIDELITY["programs"]:
        assert p["bisect"]["model_bytes"] == p["bisect"]["device_bytes"], p["name"]


SCAN_DEPARTS = ("scanning upwards in 2 MiB steps from the torch log's live peak, the model first fits at "
                "459,276,288 B, where RMM's pool failed (its first fit: 465,567,744 B); the event at which "
                "the real pool failed there was not recorded, so the cause is not known")


@pytest.mark.xfail(strict=True, reason=SCAN_DEPARTS)
def test_the_scanned_smallest_maximum_is_rmms() -> None:
    for p in FIDELITY["programs"]:
        assert p["bisect"]["model_scanned_bytes"] == p["bisect"]["device_scanned_bytes"], p["name"]


def test_advises_margin_for_rmm_covers_the_models_measured_error() -> None:
    """Where the model gets through below RMM's own first fit, by at most the margin advise keeps."""
    from tracekit.advise.verdict import MODEL_ERRORS
    from tracekit.sim.base import Allocator

    fraction = min(e.fraction for e in MODEL_ERRORS if e.allocator == Allocator.RMM_POOL)
    for p in FIDELITY["programs"]:
        b = p["bisect"]
        for model, real in ((b["model_bytes"], b["device_bytes"]), (b["model_scanned_bytes"],
                                                                    b["device_scanned_bytes"])):
            assert real - model <= fraction * real, p["name"]
