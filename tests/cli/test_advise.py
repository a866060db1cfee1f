"""``tracekit advise``: worked answers on hand-built traces, and the real PyTorch OOM.

CuPy example (MiB units, ``set_limit`` 6): a loop allocates a workspace at ``w.py:3``
(2, then 3, then 4), keeps a 1 MiB result at ``w.py:4`` and frees the workspace. The pool
keeps the first result in its own 1 MiB device allocation and splits the second one out
of the freed 2 MiB workspace, which stays pinned; at the 4 MiB request ``free_all_blocks``
can only return the 3 MiB workspace, 3 + 4 > 6, and the request fails with 6 MiB live
(the lower bound). ``free_all_blocks()`` before every workspace allocation returns each
old workspace before the next one is made, so the second result gets a device allocation
of its own and the 4 MiB request fits exactly (peak 6, five device allocations, two
frees). With more room the pool itself fits once 3 + 4 = 7 MiB is allowed: 8 MiB in 2 MiB
steps. The device-allocator models fit: 6 MiB live.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.advise.candidates import Kind
from tracekit.advise.run import advise
from tracekit.advise.verdict import Verdict
from tracekit.cli.app import app
from tracekit.trace import Events, Op, Source, Trace, TraceMeta, read_trace, write_trace
from tracekit.trace.validate import pair_events

MIB = 1 << 20
M, F, SA, SF, OO = Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.OOM
TRACES = Path(__file__).resolve().parents[2] / "traces"
WORK, KEEP = 0, 1


def mk(rows: list[tuple[int, int, int, int]], source: Source = Source.CUPY,
       limit: int | None = None) -> Trace:
    """(op, size in MiB, addr, site) rows."""
    op = np.array([r[0] for r in rows], np.int8)
    ev = Events.build(op, np.array([r[1] * MIB for r in rows], np.uint64),
                      addr=np.array([r[2] for r in rows], np.uint64),
                      rounded=np.array([r[1] * MIB if r[0] in (M, OO) else 0 for r in rows], np.uint64),
                      site=np.array([r[3] for r in rows], np.int32), sites=("w.py:3:step", "w.py:4:step"))
    pairing = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    return Trace(None, TraceMeta.new(source, pool_limit_bytes=limit), ev, pairing.mate, None, ())


A, B, C = 0x1000 * MIB, 0x2000 * MIB, 0x3000 * MIB
CUPY_ROWS = [
    (SA, 2, A, -1), (M, 2, A, WORK), (SA, 1, B, -1), (M, 1, B, KEEP), (F, 2, A, -1),
    (SA, 3, C, -1), (M, 3, C, WORK), (M, 1, A, KEEP), (F, 3, C, -1),
    (SF, 3, C, -1), (OO, 4, 0, WORK),  # free_all_blocks returned the 3 MiB workspace: still 3 + 4 > 6
]


def by_kind(result, kind: Kind):
    return next(o for o in result.tried if o.candidate.kind == kind)


def test_cupy_worked_example():
    r = advise(mk(CUPY_ROWS, limit=6 * MIB), jobs=1)
    assert r.kind == "cupy" and r.limit == 6 * MIB and r.lower_bound == 6 * MIB
    pool = by_kind(r, Kind.CUPY_POOL)
    assert not pool.fits and pool.failed_at is not None and pool.verdict == Verdict.NO
    rel = by_kind(r, Kind.CUPY_RELEASE)
    assert rel.candidate.site == "w.py:3:step"
    assert (rel.fits, rel.peak_reserved, rel.headroom) == (True, 6 * MIB, 0)
    assert (rel.device_allocs, rel.device_frees, rel.verified_by_replay) == (5, 2, True)
    # Exactly at the limit: the replay gets through with 0 headroom, which is never a fit.
    assert rel.verdict == Verdict.BORDERLINE and rel in r.borderline
    for kind in (Kind.CUPY_ASYNC, Kind.CUDA_MALLOC):
        o = by_kind(r, kind)
        assert o.fits and o.peak_reserved == 6 * MIB and not o.verified_by_replay
        assert o.verdict == Verdict.BORDERLINE
    raised = by_kind(r, Kind.CUPY_LIMIT)
    assert (raised.capacity, raised.peak_reserved, raised.verdict) == (8 * MIB, 7 * MIB, Verdict.FITS)
    assert [o.candidate.kind for o in r.fits] == [Kind.CUPY_LIMIT]
    # One MiB more and every one of them fits: within the limit and replayed beats modelled, which
    # beats a raised limit.
    r = advise(mk(CUPY_ROWS, limit=6 * MIB), limit=7 * MIB, jobs=1)
    assert [o.candidate.kind for o in r.fits] == [Kind.CUPY_RELEASE, Kind.CUPY_ASYNC, Kind.CUDA_MALLOC,
                                                  Kind.CUPY_LIMIT]
    assert all(o.verdict == Verdict.FITS and o.headroom == MIB for o in r.fits[:3])
    assert "free_all_blocks()" in r.recommendation() and "w.py:3:step" in r.recommendation()
    d = r.to_dict()
    assert {"fits", "recommendation", "min_capacity_bytes", "lower_bound_bytes"} <= set(d)
    assert d["scope"] == "verified through the failing request; the run past it was not recorded"


def test_cupy_recorded_release_at_the_oom_is_not_carried_over():
    """The recorded free_all_blocks at the failing request belongs to the pool's retry: removed."""
    from tracekit.advise.counterfactual import internal_releases, prepare

    t = mk(CUPY_ROWS, limit=6 * MIB)
    assert internal_releases(t, 6 * MIB).tolist() == [False] * 9 + [True, False]
    assert (prepare(t).events.op == SF).sum() == 0


def test_raw_trace_free_lists():
    """Holes of 2 and 1 MiB, then 1 and 2 MiB requests in a 6 MiB heap: best fit keeps the 2 MiB hole
    (extent 5 MiB, 1 MiB headroom); first fit splits it and needs 7 MiB."""
    rows = [(M, 2, 1, -1), (M, 1, 2, -1), (M, 1, 3, -1), (M, 1, 4, -1), (F, 2, 1, -1), (F, 1, 3, -1),
            (M, 1, 5, -1), (M, 2, 6, -1)]
    r = advise(mk(rows, Source.SYNTHETIC), limit=6 * MIB, jobs=1)
    fit = {o.candidate.policy for o in r.fits}
    assert "best-fit" in fit and "first-fit" not in fit
    assert all(o.candidate.kind == Kind.FREE_LIST for o in r.tried)
    from tracekit.sim import policies as registry

    # the registry's heaps, each tried once, nothing else replayed to be dropped
    assert sorted(o.candidate.policy or "" for o in r.tried) == sorted(
        n for n in registry.names() if registry.is_heap(n))
    assert r.recommendation().startswith("best-fit free list fits")


def test_raw_trace_without_a_limit_is_a_usage_error():
    from tracekit.errors import UsageError

    with pytest.raises(UsageError, match="--limit"):
        advise(mk([(M, 1, 1, -1)], Source.SYNTHETIC), jobs=1)


def test_nothing_fits_gives_the_smallest_capacity_and_the_call_sites():
    r = advise(mk(CUPY_ROWS, limit=4 * MIB), device_total=6 * MIB, jobs=1)
    assert not [o for o in r.fits if o.candidate.kind != Kind.CUPY_LIMIT]
    assert r.min_capacity is not None and r.min_capacity >= r.lower_bound
    assert r.top_sites[0].site == "w.py:3:step" and r.top_sites[0].bytes == 4 * MIB
    assert r.recommendation().startswith("Nothing tried fits under 4.00 MiB")


@pytest.fixture(scope="module")
def torch_oom():
    return advise(read_trace(TRACES / "torch-oom.parquet"), jobs=1)


def test_torch_oom_advice(torch_oom):
    r = torch_oom
    assert r.kind == "torch" and r.limit == 15_038_676_992 and r.failing_seq is not None
    default = next(o for o in r.tried if not o.candidate.options)
    assert not default.fits  # the recorded run's own failure is reproduced
    labels = {o.candidate.label() for o in r.fits}
    assert "expandable_segments:True" in labels
    for o in r.fits:
        assert o.peak_reserved <= r.limit and o.verified_by_replay
    assert not any({"expandable_segments", "max_split_size_mb"} <= set(o.candidate.opts) for o in r.tried)
    assert "PYTORCH_CUDA_ALLOC_CONF=" in r.recommendation()
    assert r.min_capacity is not None and r.lower_bound <= r.min_capacity <= r.limit


def test_cli_json_and_text(tmp_path):
    path = tmp_path / "frag.parquet"
    t = mk(CUPY_ROWS, limit=6 * MIB)
    write_trace(path, t.meta, t.events, None)
    res = CliRunner().invoke(app, ["advise", str(path), "--json", "--jobs", "1", "--limit", "7MiB"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["fits"][0]["line"].startswith("cupy.get_default_memory_pool().free_all_blocks()")
    assert d["lower_bound_bytes"] == 6 * MIB
    res = CliRunner().invoke(app, ["advise", str(path), "--jobs", "1", "--limit", "8MiB"])
    assert res.exit_code == 0 and "recommendation:" in res.output


def test_cli_exit_codes(tmp_path):
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "tracekit", "advise", *args]
        return subprocess.run(cmd, capture_output=True, text=True)

    missing = run(str(tmp_path / "nope.parquet"))
    assert missing.returncode == 1 and "no such file" in missing.stderr and "Traceback" not in missing.stderr
    bad = run(str(TRACES / "cupy-oom-frag.parquet"), "--limit", "lots")
    assert bad.returncode == 2 and "--limit" in bad.stderr and "Traceback" not in bad.stderr


def test_a_failure_the_trace_does_not_explain_gets_no_fit():
    # A CuPy run that died of an OOM with nothing allocated, under a 6 MiB limit: its own setting,
    # replayed exactly as recorded, serves every request, so the memory went elsewhere.
    rows = [(OO, 1, 0, WORK), (OO, 1, 0, WORK), (OO, 2, 0, WORK)]
    r = advise(mk(rows, limit=6 * MIB), jobs=1)
    assert r.fits == ()
    assert r.margin is not None and not r.margin.explains
    rec = r.recommendation()
    assert rec.startswith("No setting is recommended") and "does not explain the failure" in rec
    assert "tracekit budget" in rec
    assert all(o.verdict != Verdict.FITS for o in r.tried)
    d = r.to_dict()
    assert d["fits"] == [] and all(not t["fits"] for t in d["tried"])
