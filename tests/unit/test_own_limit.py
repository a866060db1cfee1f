"""A PyTorch recording's limit that ``record --limit`` did not set: advise's command that records the
whole program once with room must say to lift it too, or the program caps the run where it died
(``tracekit.advise.run.own_limit``), on committed recordings of each kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.advise.result import OwnLimit
from tracekit.advise.run import own_limit
from tracekit.trace.reader import read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_record_limit_is_not_the_programs() -> None:
    """Recorded under ``record --torch --limit``: the limit is record's, nothing more to raise."""
    t = read_trace(TRACES / "torch-wlm.parquet")
    assert t.meta.recorded.rerun is not None and t.meta.recorded.rerun.limit_bytes == t.meta.pool_limit_bytes
    assert own_limit(t) is None


def test_the_programs_own_fraction() -> None:
    """``--fraction 0.035`` in the program, no ``--limit`` to record: the program's, certainly."""
    t = read_trace(TRACES / "torch-resnet35.parquet")
    assert t.meta.recorded.rerun is not None and t.meta.recorded.rerun.limit_bytes is None
    assert own_limit(t) == OwnLimit(5_253_845_811, certain=True)


def test_a_trace_that_does_not_say_how_it_ran() -> None:
    t = read_trace(TRACES / "torch-resnet-fraction.parquet")
    assert t.meta.recorded.rerun is None
    assert own_limit(t) == OwnLimit(4_503_296_409, certain=False)


RESNET35 = ("tracekit record --torch -o torch-resnet35-whole.parquet scripts/torch_workload_resnet.py "
            "--fraction 0.035, with the limit the program sets itself (5253845811 bytes in the recording) "
            "lifted) and advise on that trace at this limit (tracekit advise torch-resnet35-whole.parquet "
            "--limit 5253845811)")
FRACTION = "with any limit the program sets itself (4503296409 bytes in the recording) lifted"


@pytest.mark.parametrize(("name", "said"), [("torch-resnet35", RESNET35),
                                           ("torch-resnet-fraction", FRACTION)])
def test_the_command_to_record_the_whole_run_says_so(name: str, said: str) -> None:
    from tracekit.advise.run import advise

    text = advise(read_trace(TRACES / f"{name}.parquet"), jobs=1).recommendation()
    assert said in text
