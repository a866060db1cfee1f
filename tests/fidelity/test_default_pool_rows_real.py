"""advise on a CuPy program whose default pool ran out at its limit while a pool of its own held memory
beside it, recorded on an H100 (``traces/fidelity/default-beside-user/``;
``scripts/gpu_default_pool_rows.sh``, 2026-12-07 22:58 UTC), and the program run again for real under
advise's settings (``advise --rerun 2``).

``scripts/pool_workloads.py default_limit_beside_user_pool``: a ``MemoryPool`` of the program's own
takes 4 x 8 MiB; the default pool, under ``record --limit 64MiB``, takes 6, 7, ..., 13 MiB and its
13 MiB request fails (CuPy: "allocated so far: 66,060,288 bytes, limit set to: 67,108,864 bytes").
CuPy's ``set_limit`` holds the default pool's own bytes alone, so advise replays that pool's rows alone
(``advise.run.default_rows``) and names ``set_limit(78 MiB)``, predicting a peak of 76 MiB; counting the
other pool's 32 MiB too it would have named about 32 MiB more. The witnesses: CuPy's own counter, which
the program printed under advise's limit, and each rerun's recording of the default pool.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tracekit.advise.candidates import Kind
from tracekit.advise.rerun import real_peak_reserved
from tracekit.advise.run import advise
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import Op

HERE = Path(__file__).resolve().parents[2] / "traces" / "fidelity" / "default-beside-user"
MiB = 1 << 20
ADVISED, RECORDED = "CuPy pool, set_limit(78.00 MiB)", "CuPy default pool"


def _real() -> dict:  # type: ignore[type-arg]
    return json.loads((HERE / "real-runs.json").read_text())


def test_advise_replays_the_default_pools_rows_alone_and_names_the_limit_the_real_runs_checked() -> None:
    trace = read_trace(HERE / "default-beside-user.parquet")
    answer, real = advise(trace, jobs=1), _real()
    assert answer.pool is None and answer.limit == 64 * MiB  # the default pool's question
    assert answer.default_alone
    assert any("the default pool's rows alone were replayed (22 of 30 events)" in n for n in answer.notes)
    fit = answer.fits[0]
    assert fit.candidate.kind == Kind.CUPY_LIMIT
    assert fit.capacity == 78 * MiB == real["advise"]["fit_capacity_bytes"]
    assert fit.peak_reserved == real["advise"]["fit_peak_reserved_bytes"] == 76 * MiB
    # every row of the device counted (a --limit asks that question) needs the other pool's 32 MiB more
    every = advise(trace, limit=64 * MiB, jobs=1)
    assert every.fits and every.fits[0].capacity >= fit.capacity + 32 * MiB


def test_the_real_program_finished_under_advises_limit_with_the_predicted_peak() -> None:
    run = _real()["reruns"][ADVISED]
    assert run["limit_bytes"] == 78 * MiB and run["exit"] == 0 and run["got_past_failing_request"]
    # CuPy's own counter, printed by the program at its end: the predicted peak, to the byte
    said = f"default pool total bytes {run['predicted_peak_reserved_bytes']} limit {78 * MiB}"
    assert run["last_line"] == said
    rerun = read_trace(HERE / run["trace"])
    assert real_peak_reserved(rerun, default_of=0) == run["predicted_peak_reserved_bytes"]
    assert real_peak_reserved(rerun) == run["all_pools_peak_reserved_bytes"] == (76 + 32) * MiB


def test_the_real_program_failed_under_the_recorded_limit_where_predicted() -> None:
    real = _real()
    run = real["reruns"][RECORDED]
    assert run["limit_bytes"] == 64 * MiB and run["exit"] != 0 and not run["got_past_failing_request"]
    assert run["last_line"] == real["recorded_last_line"]  # the same request, the same 63 MiB held
    rerun = read_trace(HERE / run["trace"])
    assert real_peak_reserved(rerun, default_of=0) == run["predicted_peak_reserved_bytes"] == 63 * MiB
    assert int(np.count_nonzero(rerun.events.op == Op.OOM)) == 1  # the one it died of


def test_analyze_and_the_page_say_the_failing_pools_own_bytes_beside_every_pools() -> None:
    """The 64 MiB limit held the default pool's 63 MiB (CuPy's "allocated so far"), not the 95 MiB of both
    pools: the report's verdict and analyze say the pool's own figure, measured, beside every pool's."""
    from tracekit.analysis.analyze import analyze_trace
    from tracekit.report.page.data import build_model

    trace = read_trace(HERE / "default-beside-user.parquet")
    analysis = analyze_trace(trace, timeline=True)
    oom = analysis.summary.oom
    assert oom is not None and oom.pool_reserved_bytes == 63 * MiB and oom.reserved_bytes == 95 * MiB
    model = build_model(trace, analysis, "t")
    assert "with 63.00 MiB reserved in its pool of the 64.00 MiB pool limit (95.00 MiB in all pools" in \
        model["verdict"]["text"]
    # the chart's limit line is named as the failing pool's, beside every pool's reserved bytes
    assert model["timeline"]["limit_what"] == "the failing pool's limit (reserved counts every pool)"
    one = analyze_trace(read_trace(HERE.parents[1] / "cupy-oom-frag.parquet")).summary.oom  # one pool
    assert one is not None and one.pool_reserved_bytes is None
