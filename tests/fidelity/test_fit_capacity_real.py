"""The capacity advise names when nothing fits, against the real program run there.

``traces/fidelity/fit-capacity/``: ``scripts/gpu_fit_capacity.py`` ran the ResNet-50 of
``traces/torch-resnet-fraction.parquet`` and ``traces/torch-resnet35.parquet`` (torchvision, AMP,
``cudnn.benchmark``) under the setting advise names, at the capacity it names as fitting with the
margin, recorded by ``tracekit record --torch``, PyTorch's own ``max_memory_reserved`` beside it (an
H100: no H200 was lent that day). Both runs got past the recording's failing request and ran out a few
requests later, in the same step: the advice holds for what the trace recorded, which ends at the
failing request, and the recommendation says so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tracekit.advise.rerun import FailingRequest, past
from tracekit.advise.run import advise
from tracekit.analysis import analyze_trace
from tracekit.trace.outcome import fatal_seq
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import Op

TRACES = Path(__file__).resolve().parents[2] / "traces"
FIT = TRACES / "fidelity" / "fit-capacity"
RUNS = json.loads((FIT / "results.json").read_text())["runs"]


@pytest.mark.parametrize("run", RUNS, ids=[r["label"] for r in RUNS])
def test_the_real_run_at_the_named_capacity(run: dict) -> None:
    recorded = read_trace(TRACES / f"{run['trace']}.parquet")
    answer = advise(recorded, jobs=1)
    # The fixture is the capacity and setting advise names today (else run the script again there).
    assert answer.fit_capacity == run["cap_bytes"]
    assert answer.min_capacity_setting is not None and answer.min_capacity_setting.label() == run["conf"]
    real = read_trace(FIT / f"{run['label']}.parquet")
    # The witness: PyTorch's own peak reserved, to the byte.
    assert analyze_trace(real, timeline=False).summary.peak_reserved_bytes == run["witness"]["max_reserved"]
    # Through the failing request: the recording's request was served (or survived) ...
    need = FailingRequest.of(recorded)
    assert need is not None and past(need, real) is True
    # ... and the program ran out after it, in the same step (the eighth: seven were done).
    died = fatal_seq(real.events, real.meta.recorded)
    assert died is not None and run["exit_code"] != 0 and run["steps_done"] == 7
    at = int(np.flatnonzero(real.events.seq == np.uint64(died))[0])
    after = int(np.count_nonzero(real.events.op[:at] == Op.MALLOC)) - need.mallocs_before
    assert 0 < after < 50
    said = answer.recommendation()
    assert "checked through the failing request only" in said
    # with the command that records the whole program once with room, to advise on at this limit
    # (tests/fidelity/test_whole_run_real.py: recorded again at each capacity named, it died each time)
    whole = f"record the whole run once with room to finish (tracekit record --torch -o {run['trace']}-whole"
    assert whole in said
    assert f"--limit {recorded.meta.pool_limit_bytes})" in said
