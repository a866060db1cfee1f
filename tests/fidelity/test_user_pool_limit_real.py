"""advise on a CuPy program whose own pool ran out at the limit the program set on it, recorded on an
H100 (``traces/fidelity/user-pool-limit/``; ``scripts/gpu_user_pool_limit.py``, 2026-12-07).

``scripts/pool_workloads.py user_pool_limit`` holds 64 MiB in the default pool (no limit), then
splinters a ``MemoryPool`` of its own under ``set_limit(48 MiB)`` until a 24 MiB request fails
(CuPy: "allocated so far: 27,262,976 bytes, limit set to: 50,331,648 bytes"). advise answers that
pool's question on its rows alone: it gets through from 50 MiB (4 + 4 + 4 + 4 + 4 MiB held, the
24 MiB request and the 6 MiB CuPy's retry cannot release; worked in ``pool_workloads.py``), and
fits with the margin at 66 MiB. The real program was then run again with its pool's limit from
the environment (``real-runs.json``, the witness): at advise's 66 MiB it finished; at 1 MiB below
the smallest capacity advise says gets through, and at the recorded 48 MiB, it failed at the same
24 MiB request.
"""

from __future__ import annotations

import json
from pathlib import Path

from tracekit.advise.candidates import Kind
from tracekit.advise.run import advise
from tracekit.trace.reader import read_trace

HERE = Path(__file__).resolve().parents[2] / "traces" / "fidelity" / "user-pool-limit"
MiB = 1 << 20
REQUEST = "Out of memory allocating 25,165,824 bytes"


def _real() -> dict:  # type: ignore[type-arg]
    return json.loads((HERE / "real-runs.json").read_text())


def test_advise_answers_the_programs_own_pool_at_its_own_limit() -> None:
    answer = advise(read_trace(HERE / "user-pool-limit.parquet"), jobs=1)
    assert answer.pool is not None and answer.pool.id == 1 and answer.pool.alone
    assert answer.limit == answer.pool.limit == 48 * MiB
    assert answer.min_capacity == 50 * MiB  # the smallest pool limit the replay gets through
    text = answer.recommendation()
    assert "another process" not in text and "does not explain" not in text
    assert text.startswith("The request failed in the program's own pool 'user 1' (pool 1 on device 0)")
    fit = answer.fits[0]
    assert fit.candidate.kind == Kind.CUPY_LIMIT and fit.capacity == 66 * MiB
    assert answer.line(fit.candidate, fit.capacity).startswith(f"pool.set_limit(size={66 * MiB})")


def test_the_answer_is_the_one_the_real_runs_checked() -> None:
    """The device's answer (``real-runs.json``) is the one advise gives on the committed trace."""
    answer, real = advise(read_trace(HERE / "user-pool-limit.parquet"), jobs=1), _real()
    assert answer.pool is not None and real["advise_pool"] == answer.pool.to_dict()
    assert real["advise_min_capacity_bytes"] == answer.min_capacity
    assert real["advise_fit"]["capacity_bytes"] == answer.fits[0].capacity


def test_the_real_program_fits_at_advises_limit_and_fails_below_it() -> None:
    runs = _real()["real_runs"]
    assert runs["advised"]["USER_POOL_LIMIT_BYTES"] == 66 * MiB and runs["advised"]["exit"] == 0
    below = runs["below the smallest that gets through"]
    assert below["USER_POOL_LIMIT_BYTES"] == 49 * MiB and below["exit"] != 0
    assert REQUEST in below["last_line"] and "limit set to: 51,380,224 bytes" in below["last_line"]
    recorded = runs["as recorded"]
    assert recorded["USER_POOL_LIMIT_BYTES"] == 48 * MiB and recorded["exit"] != 0
    assert REQUEST in recorded["last_line"]


def test_the_page_says_the_pools_setting_is_made_in_the_program() -> None:
    """The report page's checks of the answer: ``advise --rerun`` cannot apply a setting of the program's
    own pool (``record --limit`` sets the default pool's), so the page does not offer it."""
    from tracekit.report.page.data import answer_of

    answer = answer_of(advise(read_trace(HERE / "user-pool-limit.parquet"), jobs=1))
    assert answer is not None
    (real,) = [c for c in answer["checks"] if c["how"] == "real run"]
    assert not real["done"]
    assert "own pool 'user 1' (pool 1 on device 0) is made in the program" in real["said"]
    assert "--rerun 1" not in real["said"]


def test_the_pools_model_and_the_real_pool_are_not_monotone_in_the_limit_alike() -> None:
    """The program run for real at 50-62 MiB (``real-runs.json`` ``limit_scan``, H100, 22:59 UTC): it finished
    at 50, 52 and 54 MiB, failed at 56, 58 and 60 MiB with 39,845,888 bytes allocated, and finished at
    62 MiB. ``replay --sim cupy --pool 1`` at each limit says the same, the bytes included: CuPy's
    "allocated so far" at each failure is the replay's reserved bytes there, and where it finished the
    pool's total (printed by the program) is the replay's peak reserved."""
    from tracekit.advise.replay import replay_file
    from tracekit.sim.base import SimConfig

    runs = _real()["limit_scan"]["runs"]
    assert len(runs) == 7
    for limit_text, run in runs.items():
        limit = int(limit_text)
        got = replay_file(HERE / "user-pool-limit.parquet", "cupy", SimConfig(capacity=limit), pool=1).summary
        if run["exit"] == 0:
            assert got.oom is None, limit
            assert run["last_line"] == f"user pool total bytes {got.peak_reserved_bytes} limit {limit}", limit
        else:
            assert got.oom is not None and got.oom.seq == 38, limit
            assert REQUEST in run["last_line"], limit
            assert f"allocated so far: {got.oom.reserved_bytes:,} bytes" in run["last_line"], limit
    fails = sorted(int(k) >> 20 for k, r in runs.items() if r["exit"] != 0)
    assert fails == [56, 58, 60]
