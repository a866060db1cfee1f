"""Every JSON shape of a replay summary, a device replay, the budget, advise's device checks, the
fidelity table and what-if is its ``TypedDict``: the keys a ``to_dict`` writes are exactly the
TypedDict's, in the order the JSON has always had.

``tests/data/json_shapes.json`` holds the JSON the same hand-built objects gave before the
dataclasses took the JSON's field names (written by that code, not by hand); the device and
budget JSON come only from a GPU, so these objects stand in for a run.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NotRequired, get_origin, get_type_hints, is_typeddict

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # the H200's measured budget
from test_budget_model import h200

from tracekit.advise.capacity import PolicyFit, PolicyFitDict, WhatIfDict, WhatIfResult
from tracekit.advise.fidelity import Comparison, ComparisonDict, ComparisonTable, ComparisonTableDict
from tracekit.advise.on_device import DeviceCheck, DeviceCheckDict
from tracekit.budget.measure import BUDGET_KEYS
from tracekit.budget.model import CheckDict, TermDict, budget_terms, cross_checks
from tracekit.budget.report import EquationDict, equation
from tracekit.budget.shapes import (
    Budget,
    CheapBudget,
    FinalFigures,
    Granularity,
    KernelLocal,
    LargestAllocation,
    Probe,
)
from tracekit.device.capacity import CapacityPlan, CapacityPlanDict
from tracekit.device.command import DeviceReplayDict, DeviceReplayOutcome
from tracekit.device.compare import (
    FigureRowDict,
    ReservedComparison,
    ReservedComparisonDict,
    SimComparisonDict,
    compare_summaries,
)
from tracekit.device.figures import (
    DeviceFigures,
    DeviceFiguresDict,
    DeviceOOM,
    DeviceOOMDict,
    Latency,
    LatencyDict,
    TorchFigures,
    TorchFiguresDict,
)
from tracekit.sim.result import OOMInfo, OOMInfoDict, ReplaySummary, ReplaySummaryDict

MiB = 1 << 20


@pytest.fixture
def before(data_dir: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((data_dir / "json_shapes.json").read_text())
    return doc


def _device_replay() -> tuple[ReplaySummary, ReplaySummary]:
    oom = OOMInfo(13, 5000, 5120, 2 * MiB - 3072, None, 3072, 2 * MiB)
    base = ReplaySummary("torch", 4 * MiB, 120 * MiB, 7, 4096, 4 * MiB, None, 2, 1, oom, 1, False,
                         handled_ooms=2)
    dev = DeviceFigures(0, "torch", 6, "exact", Latency(2050.0, 2099.0, 2), Latency(None, None, 0), 140 << 30,
                        120 * MiB, 118 * MiB, 120 * MiB, 2 * MiB, oom=DeviceOOM(96 * MiB, "Out of memory"))
    torch = TorchFigures("2.11.0", "expandable_segments:True", (("expandable_segments", "True"),), True,
                         False, 3, 4, 1)
    sim = ReplaySummary("torch", 4 * MiB, None, 7, 4000, 4 * MiB, None, 2, 1, oom, 1, False)
    return base.with_figures(dev, torch), sim


def _outcome() -> DeviceReplayOutcome:
    s, sim = _device_replay()
    reserved = (ReservedComparison("model, recorded addresses", 5, 5, None, None, None, None),
                ReservedComparison("model, this device's addresses", 5, 3, 2, 12, 2 * MiB, 4 * MiB))
    return DeviceReplayOutcome(s, replace(compare_summaries(s, sim, "torch"), reserved=reserved), None, None)


def _whatif() -> WhatIfResult:
    fits = (PolicyFit("best-fit", 8 * MiB, 6 * MiB, 9 * MiB, 5, 1 << 50),
            PolicyFit("cupy", None, 6 * MiB, None, 0, 1 << 50, error="E: x"))
    return WhatIfResult("t.parquet", 6 * MiB, 2 * MiB, None, fits, device=0)


def _same(got: object, want: object) -> None:
    """Equal as JSON, key order included."""
    assert json.dumps(got, indent=1) == json.dumps(want, indent=1)


def test_a_device_replay_writes_the_json_it_always_wrote(before: dict[str, Any]) -> None:
    s, _ = _device_replay()
    _same(s.to_dict(), before["summary"])
    bare = ReplaySummary("cupy", None, None, 0, 0, 0, None, 0, 0, None, 0, False).with_figures(
        DeviceFigures(1, "cuda", 0, "sampled", Latency(None, None, 0), Latency(None, None, 0), 1, 1, 1, 0, 0))
    _same(bare.to_dict(), before["summary_no_oom"])
    _same(_outcome().to_dict(), before["outcome"])
    assert _outcome().to_text() == before["outcome_text"]
    _same(CapacityPlan(4 * MiB, 6 * MiB, None).to_dict(), before["plan"])


def test_the_budget_json_is_the_measured_figures_then_the_equation(before: dict[str, Any]) -> None:
    b = h200(probe={"largest": {"largest": 149_000_000_000, "free": 149_557_477_376}})
    terms = budget_terms(b)
    _same({**b, **equation(terms, cross_checks(b, terms))}, before["budget"])


def test_advise_fidelity_and_whatif_shapes(before: dict[str, Any]) -> None:
    checks = [DeviceCheck("expandable_segments:True", True, True, 3 * MiB),
              DeviceCheck("free_all_blocks()", True, None, None, "cannot insert")]
    _same([c.to_dict() for c in checks], before["device_checks"])
    table = ComparisonTable("torch-oom.parquet", (Comparison("a.parquet", "defaults", 10, True, 9, 4, 5 * MiB,
                                                             6 * MiB, True, False),))
    _same(table.to_dict(), before["fidelity"])
    one = _whatif()
    _same(one.to_dict(), before["whatif"])
    several = WhatIfResult("t.parquet", None, 2 * MiB, 8 * MiB,
                           devices=(one, WhatIfResult("t.parquet", 1, 2 * MiB, 8 * MiB, (), device=1)))
    _same(several.to_dict(), before["whatif_devices"])


def _keys(shape: type) -> tuple[set[str], set[str]]:
    """(required, optional) keys. Read from the hints: under ``from __future__ import annotations``
    Python 3.11 counts a ``NotRequired`` key among ``__required_keys__``."""
    assert is_typeddict(shape)
    hints = get_type_hints(shape, include_extras=True)
    optional = {k for k, h in hints.items() if get_origin(h) is NotRequired}
    optional |= set(shape.__optional_keys__)  # type: ignore[attr-defined]
    return set(hints) - optional, optional


def _check(value: object, shape: type) -> None:
    """``value`` has every required key of ``shape``, no key it does not name, and each nested
    TypedDict value (or list of them) has its own shape."""
    assert isinstance(value, dict)
    required, optional = _keys(shape)
    assert required <= set(value) <= required | optional, (shape.__name__, set(value) ^ required)
    hints = get_type_hints(shape)
    for key, v in value.items():
        for inner in _typeddicts(hints[key]):
            for item in v if isinstance(v, list) else [v]:
                if isinstance(item, dict):
                    _check(item, inner)


def _typeddicts(hint: Any) -> list[type]:
    """The TypedDicts a type hint names (``X | None``, ``list[X]``, ``NotRequired[X]``)."""
    if is_typeddict(hint):
        return [hint]
    return [t for arg in getattr(hint, "__args__", ()) for t in _typeddicts(arg)]


def test_every_key_written_is_a_key_of_its_typeddict() -> None:
    s, _ = _device_replay()
    out = _outcome()
    assert out.comparison is not None
    cases: list[tuple[object, type]] = [
        (s.oom.to_dict() if s.oom else None, OOMInfoDict),
        (out.to_dict(), DeviceReplayDict),
        (out.comparison.to_dict(), SimComparisonDict),
        (out.comparison.rows[0].to_dict(), FigureRowDict),
        (out.comparison.reserved[1].to_dict() if out.comparison.reserved else None, ReservedComparisonDict),
        (Latency(1.0, 2.0, 3).to_dict(), LatencyDict),
        (DeviceOOM(1, None).to_dict(), DeviceOOMDict),
        (CapacityPlan(None, 0, None).to_dict(), CapacityPlanDict),
        (DeviceCheck("x", True, False, 1).to_dict(), DeviceCheckDict),
        (Comparison("a", "b", 1, True, 1, None, 1, 1, True, True).to_dict(), ComparisonDict),
        (ComparisonTable("b", ()).to_dict(), ComparisonTableDict),
        (_whatif().fits[0].to_dict(), PolicyFitDict),
        (_whatif().to_dict(), WhatIfDict),
    ]
    b = h200()
    terms = budget_terms(b)
    eq = equation(terms, cross_checks(b, terms))
    cases += [(eq, EquationDict), (eq["terms"][0], TermDict), (eq["checks"][0], CheckDict)]
    for value, shape in cases:
        _check(value, shape)
    # The shapes nest: a summary's device group, the device replay's comparison, their rows.
    assert _typeddicts(get_type_hints(DeviceReplayDict)["device"]) == [DeviceFiguresDict]
    assert _typeddicts(get_type_hints(DeviceReplayDict)["torch"]) == [TorchFiguresDict]
    assert _keys(ReplaySummaryDict)[0] | {"device"} == _keys(DeviceReplayDict)[0]
    assert _keys(DeviceReplayDict)[1] == {"torch", "compare_sim"}


def test_a_renamed_key_is_caught() -> None:
    # The check above fails on a key its TypedDict does not name, and on one it misses.
    d = dict(CapacityPlan(None, 0, None).to_dict())
    with pytest.raises(AssertionError):
        _check({**d, "ballast": 0}, CapacityPlanDict)
    del d["ballast_bytes"]
    with pytest.raises(AssertionError):
        _check(d, CapacityPlanDict)


def test_the_budget_keys_documented_are_the_cheap_budgets_keys() -> None:
    required, optional = _keys(CheapBudget)
    assert (required, optional) == (set(BUDGET_KEYS), set())
    assert _keys(Budget) == (set(BUDGET_KEYS), {"probe", "kernel_local", "final"})


def test_every_recorded_budget_has_the_cheap_budgets_shape(traces_dir: Path) -> None:
    # What `tracekit record` stored at the start of each committed CuPy trace, on the H200.
    from tracekit.trace import read_trace

    seen = 0
    for path in sorted(traces_dir.glob("cupy-*.parquet")):
        b = read_trace(path, extras=False).meta.extra.get("budget")
        assert isinstance(b, dict), path.name
        _check(b, CheapBudget)
        seen += 1
    assert seen >= 10


def test_a_full_budget_has_the_budgets_shape() -> None:
    # The figures of `budget --kernel-local-bytes 16384 --probe-largest` on the H200, rounded.
    largest = LargestAllocation(free=149_557_477_376, largest=149_555_380_224, gap=2_097_152,
                                fraction=0.99998, attempts=17, step=2 * MiB, free_after=149_557_477_376)
    grain = [Granularity(request=512, count=4, cost=2 * MiB, per_allocation=MiB // 2, alignment=512)]
    kl = KernelLocal(local_bytes=16384, local_size_bytes=16384, grid=2112, block=128, free_before=1 << 37,
                     load_bytes=2 * MiB, launch_bytes=3960 * MiB, kept_bytes=3962 * MiB,
                     stack_size_before=1024, stack_size_after=16384, model_bytes=4224 * MiB,
                     launch_over_model=0.9375, free_after_restore=None, restore_gave_back=None)
    final = FinalFigures(cuda_free=145_400_000_000, cupy_pool_total_bytes=0, cupy_pool_used_bytes=0)
    b: Budget = {**h200(), "probe": Probe(largest=largest, granularity=grain),  # type: ignore[typeddict-item]
                 "kernel_local": kl, "final": final}
    _check(b, Budget)
    terms = budget_terms(b)
    assert next(t for t in terms if t.name == "kernel module + local memory").bytes == 3962 * MiB
    assert next(t for t in terms if t.name == "free").bytes == 145_400_000_000
    with pytest.raises(AssertionError):  # a probe short of a key is caught
        _check({**b, "probe": {"largest": {"largest": 1, "free": 1}, "granularity": []}}, Budget)
