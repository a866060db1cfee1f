"""advise's verdicts against the real program run under each setting on the H200.

Fixtures: ``traces/torch-fidelity-runs.json`` (every setting advise rated on ResNet-50 at a 3 %
cap and on GPT-2, run for real by ``scripts/torch_fidelity_check.py``) and ``traces/fidelity/*.json``
(``scripts/gpu_real_advice.py``: ``advise --rerun`` on pytorch/examples programs and ResNet-50 at a
second cap). advise is run again here on the committed traces; no GPU is needed.

- No setting advise calls a fit failed for real.
- Every figure of ``MODEL_ERRORS`` covers the largest measured excess of a real peak reserved over
  the prediction for its allocator and workload, so the margin is the measured error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tracekit.advise.run import advise
from tracekit.advise.verdict import MODEL_ERRORS, Verdict, workload_of
from tracekit.trace import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
RUNS = json.loads((TRACES / "torch-fidelity-runs.json").read_text())
# traces/fidelity/ also holds other fidelity records (rmm.json: the RMM model against RMM's own pool);
# the advise reruns are the files that carry an ``advise`` answer.
FIXTURES = [f for f in sorted((TRACES / "fidelity").glob("*.json"))
            if "advise" in json.loads(f.read_text())]


def _real_rows() -> list[tuple[str, str, bool, int, int]]:
    """(trace, setting, real run got through, real peak reserved, capacity) of every real run."""
    out = []
    names = {k: v["trace"] for k, v in RUNS["programs"].items()}
    for r in RUNS["runs"]:
        out.append((names[r["program"]], r["setting"], bool(r["real_fits"]), int(r["real_peak_reserved"]),
                    int(r["capacity"])))
    for f in FIXTURES:
        d = json.loads(f.read_text())
        for r in d["advise"]["reruns"]:
            if r["ran"] and r["real_peak_reserved_bytes"] is not None:
                past = r["got_past_failing_request"]
                real = past if past is not None else r["finished"]
                out.append((d["trace"], r["setting"], bool(real), int(r["real_peak_reserved_bytes"]),
                            int(d["advise"]["limit_bytes"])))
    return out


ROWS = _real_rows()
TRACE_NAMES = sorted({r[0] for r in ROWS})


@pytest.fixture(scope="module")
def advised() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name in TRACE_NAMES:
        t = read_trace(TRACES / name)
        res = advise(t, jobs=1)
        out[name] = {"workload": workload_of(t)[0], "tried": {o.label(): o for o in res.tried}}
    return out


def test_there_are_real_runs_of_several_programs() -> None:
    assert len(ROWS) >= 35 and len(TRACE_NAMES) >= 2


def test_no_setting_called_a_fit_failed_for_real(advised: dict[str, dict[str, object]]) -> None:
    wrong = []
    for name, setting, real_ok, _, _ in ROWS:
        tried = advised[name]["tried"]
        assert isinstance(tried, dict)
        o = tried.get(setting)
        if o is not None and o.verdict == Verdict.FITS and not real_ok:
            wrong.append((name, setting))
    assert wrong == []


def test_the_margins_cover_the_measured_error(advised: dict[str, dict[str, object]]) -> None:
    worst: dict[object, float] = {}
    for name, setting, _, real_peak, cap in ROWS:
        tried = advised[name]["tried"]
        assert isinstance(tried, dict)
        o = tried.get(setting)
        if o is None:
            continue
        key = advised[name]["workload"]
        worst[key] = max(worst.get(key, 0.0), (real_peak - o.peak_reserved) / cap)
    for key, excess in worst.items():
        err = next(e for e in MODEL_ERRORS if e.allocator == "torch" and e.workload == key)
        assert excess <= err.fraction, (key, excess)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_advise_here_says_what_it_said_on_the_device(fixture: Path,
                                                     advised: dict[str, dict[str, object]]) -> None:
    d = json.loads(fixture.read_text())
    tried = advised[d["trace"]]["tried"]
    assert isinstance(tried, dict)
    for r in d["advise"]["tried"]:
        o = tried[r["setting"]]
        here = (o.verdict.value if o.verdict else None, o.peak_reserved)
        assert here == (r["verdict"], r["peak_reserved_bytes"]), r["setting"]


def test_past_the_failing_request_on_real_reruns() -> None:
    # The three reruns of the 3.5 % ResNet-50 recording on the H200 (traces/fidelity/resnet35r-reruns):
    # each died of an OOM; whether it got past the recorded failing request is what the device said.
    from tracekit.advise.rerun import FailingRequest, past

    d = json.loads((TRACES / "fidelity" / "resnet35r.json").read_text())
    failing = FailingRequest.of(read_trace(TRACES / "torch-resnet35.parquet"))
    runs = [r for r in d["advise"]["reruns"] if r["ran"]]
    assert len(runs) == 3
    for k, r in enumerate(runs, 1):
        t = read_trace(TRACES / "fidelity" / "resnet35r-reruns" / f"rerun-{k}.parquet")
        assert past(failing, t) == r["got_past_failing_request"]
