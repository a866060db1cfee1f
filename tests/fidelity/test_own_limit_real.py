"""advise on a CuPy program that caps its pool itself, recorded on an H100 without ``record --limit``
(``traces/fidelity/own-limit/``; ``scripts/gpu_own_limit.sh``, 2026-12-07).

``scripts/record_workloads.py oom`` calls ``set_limit(size=256 MiB)`` once it runs, when the pool
has no limit: the recorder read no limit at the start (``pool_limit_bytes`` is null), and the limit
is in the trace as measured at the OOM and as the program left its pool. Before, advise took the
device's size as the limit and called the OOM unexplained; now it answers at the program's 256 MiB
(``trace.outcome.held_limit``). ``rerun-308MiB.parquet`` is ``advise --rerun``'s real run under its
raised ``set_limit`` (``record --limit 308MiB``, which the program keeps: it sets its own only where
none is set): it went past the request the recording failed at, as predicted, and died later in
the run, as the whole-run caveat says a run may.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracekit.advise.candidates import Kind
from tracekit.advise.result import OwnLimit
from tracekit.advise.run import advise
from tracekit.trace.events import segment_delta
from tracekit.trace.outcome import fatal_seq, held_limit
from tracekit.trace.reader import read_trace

HERE = Path(__file__).resolve().parents[2] / "traces" / "fidelity" / "own-limit"
MiB = 1 << 20


def test_the_program_set_its_limit_after_the_recording_began() -> None:
    t = read_trace(HERE / "own.parquet")
    assert t.meta.pool_limit_bytes is None and t.meta.recorded.rerun is not None
    assert t.meta.recorded.rerun.limit_bytes is None  # recorded without --limit
    assert held_limit(t.events, t.meta) == 256 * MiB  # CuPy's own message: "limit set to: 268,435,456 bytes"


def test_advise_answers_at_the_programs_limit() -> None:
    t = read_trace(HERE / "own.parquet")
    answer = advise(t, jobs=1)
    assert answer.limit == 256 * MiB and answer.failing_seq == fatal_seq(t.events, t.meta.recorded) == 164
    assert answer.fits and answer.fits[0].candidate.kind == Kind.CUPY_RELEASE
    assert answer.own_limit == OwnLimit(256 * MiB, certain=True)
    text = answer.recommendation()
    assert "the trace does not explain the failure" not in text
    assert "lifting the limit the program sets itself (268435456 bytes in the recording)" in text


def test_the_raised_limit_ran_past_the_failing_request_with_the_peak_predicted() -> None:
    """The real run under ``set_limit(308 MiB)``: past seq 164 (the recording's failing request), its
    reserved bytes through there the replay's peak to the byte (307.50 MiB)."""
    t = read_trace(HERE / "own.parquet")
    raised = next(o for o in advise(t, jobs=1).tried if o.candidate.kind == Kind.CUPY_LIMIT)
    real = read_trace(HERE / "rerun-308MiB.parquet")
    assert real.meta.pool_limit_bytes == raised.capacity == 308 * MiB
    died = fatal_seq(real.events, real.meta.recorded)
    assert died is not None and died > 164  # past the failing request; then the pool ran out again
    through = np.flatnonzero(real.events.seq <= 164)
    reserved = np.cumsum(segment_delta(real.events))[through]
    assert int(reserved.max()) == raised.peak_reserved == 322_437_120


def test_the_setting_a_real_run_ran_under_names_the_programs_limit() -> None:
    """``advise.fidelity.run_setting``, what a real run is compared under: the program's 256 MiB, not
    "no limit" (its start metadata has none)."""
    from tracekit.advise.fidelity import run_setting

    text, _, _, capacity = run_setting(read_trace(HERE / "own.parquet"))
    assert (text, capacity) == ("set_limit(256.00 MiB)", 256 * MiB)
