"""The one verdict: worked answers for ``decide``, and the margin each kind of trace gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.advise.verdict import PAGE, Margin, Verdict, Workload, decide, margin_for, workload_of
from tracekit.trace import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
MIB = 1 << 20
TWO_PERCENT = Margin(Workload.REACTIVE, 0.02, PAGE, "test")


@pytest.mark.parametrize(("fits", "error", "headroom", "want"), [
    (True, None, 100 * MIB, Verdict.FITS),  # 100 MiB > 2 % of 1 GiB (20.48 MiB)
    (True, None, 20 * MIB, Verdict.BORDERLINE),  # within the margin
    (True, None, 0, Verdict.BORDERLINE),  # exactly at the limit is never a fit
    (True, None, -5 * MIB, Verdict.NO),  # peak reserved above the limit
    (False, None, 500 * MIB, Verdict.NO),  # the replay ran out
    (True, "boom", 500 * MIB, Verdict.ERROR),
])
def test_decide_worked_answers(fits: bool, error: str | None, headroom: int, want: Verdict) -> None:
    assert decide(fits, error, headroom, 1 << 30, TWO_PERCENT) == want


def test_the_margin_has_a_floor() -> None:
    assert TWO_PERCENT.bytes_at(10 * MIB) == PAGE
    assert decide(True, None, PAGE, 10 * MIB, TWO_PERCENT) == Verdict.BORDERLINE
    assert decide(True, None, PAGE + 1, 10 * MIB, TWO_PERCENT) == Verdict.FITS


def test_no_limit_fits() -> None:
    assert decide(True, None, None, None, TWO_PERCENT) == Verdict.FITS


def test_workload_kinds_of_committed_traces() -> None:
    # cuDNN's handled workspace OOMs: the program reacts to memory.
    assert workload_of(read_trace(TRACES / "torch-resnet-fraction.parquet"))[0] == Workload.REACTIVE
    # A transformer language model: requests fixed by the program.
    assert workload_of(read_trace(TRACES / "torch-gpt2-lengths.parquet"))[0] == Workload.STEADY
    cupy = margin_for("cupy", read_trace(TRACES / "cupy-oom-frag.parquet"))
    assert cupy.workload == Workload.STEADY and cupy.bytes_at(256 * MIB) == 0 and cupy.exact
    raw = margin_for("raw", read_trace(TRACES / "cupy-oom-frag.parquet"))
    assert raw.fraction == 0 and raw.floor == 0
    assert decide(True, None, 1, 256 * MIB, cupy) == Verdict.FITS
    assert decide(True, None, 0, 256 * MIB, cupy) == Verdict.BORDERLINE  # 0 itself: never a fit
    assert decide(True, None, -1, 256 * MIB, cupy) == Verdict.NO


def test_a_torch_trace_without_call_sites_keeps_the_reactive_margin() -> None:
    """Without call-sites nothing shows that no cuDNN convolution chose its workspace at run time:
    the same ResNet recorded with stacks is reactive, so without them the margin stays reactive."""
    bare = read_trace(TRACES / "torch-ends-os_exit.parquet")
    assert not (bare.events.site >= 0).any()
    assert margin_for("torch", bare).workload == Workload.REACTIVE
    assert workload_of(bare)[0] == Workload.STEADY  # no allocator named: nothing to be careful for
