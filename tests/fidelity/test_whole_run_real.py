"""advise on a run that died: the trace of the whole run, recorded once with room, against the real
program at the capacity named (``traces/fidelity/whole-run/``, an H100; ``scripts/gpu_advise_loop.py``
and ``scripts/gpu_fit_capacity.py``, 2026-12-07): a ResNet-50 and a GPT-2 (``gpt2/``).

The ResNet-50 of ``traces/fidelity/fit-capacity/`` (torchvision, AMP, ``cudnn.benchmark``, eight
steps) was first taken round after round as advise used to ask: recorded again at the capacity named,
advised on again. Each of six rounds died a few requests further on in the eighth step, each named
capacity 2.6-4.2 % above the one before (``ratchet``). Recorded once whole with room (half the
device) and advised at the original caps, advise named one setting and capacity; the real run there
completed all eight steps; three real runs between the ratchet's last capacity and that one died.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from tracekit.advise.run import advise
from tracekit.analysis import analyze_trace
from tracekit.trace.outcome import fatal_seq
from tracekit.trace.reader import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
WHOLE = TRACES / "fidelity" / "whole-run"
RESULTS = json.loads((WHOLE / "results.json").read_text())


@pytest.mark.parametrize("run", RESULTS["advised"], ids=[str(r["asked_limit"]) for r in RESULTS["advised"]])
def test_the_capacity_named_on_the_whole_run_lets_the_real_run_complete(run: dict) -> None:
    whole = read_trace(WHOLE / RESULTS["whole"]["trace"])
    assert fatal_seq(whole.events, whole.meta.recorded) is None  # the whole run: it completed
    answer = advise(whole, limit=run["asked_limit"], jobs=1)
    # The fixture is what advise names today (else run the script again there).
    assert not answer.fits and answer.failing_seq is None
    assert answer.fit_capacity == run["capacity_bytes"]
    assert answer.min_capacity_setting is not None and answer.min_capacity_setting.label() == run["setting"]
    assert "checked through the failing request only" not in answer.recommendation()
    # The real program at that capacity under that setting: all eight steps, no OOM ...
    assert run["exit_code"] == 0 and run["steps_done"] == RESULTS["steps"] and run["witness"]["num_ooms"] == 0
    # ... with PyTorch's own peak reserved inside the capacity, and the trace of it saying the same
    assert run["witness"]["max_reserved"] <= run["capacity_bytes"]
    real = read_trace(WHOLE / RESULTS["fit_trace"])
    assert analyze_trace(real, timeline=False).summary.peak_reserved_bytes == run["witness"]["max_reserved"]
    assert fatal_seq(real.events, real.meta.recorded) is None
    # Not far above what the program needs: the whole run's live bytes alone are within 5 % of it
    assert answer.lower_bound < run["capacity_bytes"] < answer.lower_bound * 1.05


def test_every_smaller_capacity_tried_for_real_died() -> None:
    """The ratchet's six rounds and the three runs between its last capacity and the one named."""
    named = min(r["capacity_bytes"] for r in RESULTS["advised"])
    died = [r["capacity_bytes"] for r in RESULTS["ratchet"]] + [r["cap_bytes"] for r in RESULTS["between"]]
    assert len(died) == 9 and max(died) < named
    assert all(r["exit_code"] != 0 and r["steps_done"] == 7 for r in RESULTS["ratchet"] + RESULTS["between"])
    # each round of the ratchet named a capacity only a few per cent above the last
    for start in ("fraction-fit", "resnet35-fit"):
        caps = [r["capacity_bytes"] for r in RESULTS["ratchet"] if r["start"] == start]
        assert all(1.02 < b / a < 1.05 for a, b in itertools.pairwise(caps))


def test_a_run_that_died_is_told_to_record_the_whole_run() -> None:
    recorded = read_trace(TRACES / "fidelity" / "fit-capacity" / "fraction-fit.parquet")
    said = advise(recorded, jobs=1).recommendation()
    assert ("record the whole run once with room to finish (tracekit record --torch -o "
            "fraction-fit-whole.parquet scripts/torch_workload_resnet.py --fraction 0.053824048150569195 "
            "--steps 8, lifting the limit the program sets itself (4575985664 bytes in the recording) "
            "wherever the command sets it)") in said
    assert "tracekit advise fraction-fit-whole.parquet --limit 4575985664" in said
    assert said.count("record the whole run") == 1 and said.endswith(".")


GPT2 = WHOLE / "gpt2"
GPT2_RESULTS = json.loads((GPT2 / "results.json").read_text())


def test_a_fit_on_a_run_that_died_early_is_said_to_hold_through_its_failing_request_only() -> None:
    """The GPT-2 (``transformers``, ``scripts/torch_workload_gpt2.py``, 24 steps) capped at 6 GiB died
    in its second step; on that trace ``expandable_segments:True`` fits with 18 MiB headroom. The whole
    run, recorded with room, holds 8.12 GiB of live bytes (PyTorch's own ``max_memory_allocated`` says
    the same), so no setting can take the program through at 6 GiB: the recommendation must say the
    fit holds through the failing request only, and how to get the trace that answers for the run."""
    capped = GPT2_RESULTS["capped"]
    recorded = read_trace(GPT2 / capped["trace"])
    assert capped["exit_code"] != 0 and capped["steps_done"] == 1
    answer = advise(recorded, jobs=1)
    assert answer.fits and answer.failing_seq is not None
    whole = read_trace(GPT2 / GPT2_RESULTS["whole"]["trace"])
    whole_answer = advise(whole, limit=capped["cap_bytes"], jobs=1)
    live = whole_answer.lower_bound
    assert live > capped["cap_bytes"]  # the whole run cannot fit the cap, whatever the setting
    assert abs(live - GPT2_RESULTS["whole"]["witness"]["max_allocated"]) <= 4 << 20
    said = answer.recommendation()
    assert said.startswith("expandable_segments:True fits under the limit of 6.00 GiB through the failing "
                           "request")
    assert ("record the whole run once with room to finish (tracekit record --torch -o capped-whole.parquet "
            "scripts/torch_workload_gpt2.py --fraction 0.07577794496725417 --steps 24, lifting the limit the "
            "program sets itself (6442450944 bytes in the recording) wherever the command sets it)") in said
    assert "tracekit advise capped-whole.parquet --limit 6442450944" in said
    # said once, the scope once, and the line to paste last
    assert said.count("record the whole run") == 1 and said.count("through the failing request") == 1
    assert said.endswith("; rerun with: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python "
                         "scripts/torch_workload_gpt2.py --fraction 0.07577794496725417 --steps 24")
    # and advise on the whole run names a capacity at which the real program completed
    run = GPT2_RESULTS["advised"][0]
    assert not whole_answer.fits and whole_answer.failing_seq is None
    assert whole_answer.fit_capacity == run["capacity_bytes"]
    assert whole_answer.min_capacity_setting is not None
    assert whole_answer.min_capacity_setting.label() == run["setting"]
    assert run["exit_code"] == 0 and run["steps_done"] == GPT2_RESULTS["steps"]
    assert run["witness"]["num_ooms"] == 0
    real = read_trace(GPT2 / GPT2_RESULTS["fit_trace"])
    assert analyze_trace(real, timeline=False).summary.peak_reserved_bytes == run["witness"]["max_reserved"]
    assert run["witness"]["max_reserved"] <= run["capacity_bytes"] < live * 1.05
