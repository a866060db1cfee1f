"""What-if capacities on traces whose answers are worked out by hand, and the whatif verb."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.advise.capacity import lower_bound, search, whatif
from tracekit.cli.app import app
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def hole_trace(tmp_path: Path) -> Path:
    """A 2 MiB, B 2 MiB, free A, C 4 MiB: at most 6 MiB live (B + C).

    An address-ordered heap of 6 MiB puts A at 0 and B at 2 MiB; freeing A leaves a 2 MiB hole
    below B, so C must go above B at [4, 8) MiB: first and best fit need 8 MiB. CuPy's pool
    holds A and B as two exact 2 MiB segments; C needs a third segment, and over a 6 MiB limit
    the pool releases A's cached segment first: 2 + 4 = 6 MiB, so it fits the lower bound.
    """
    op = np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.MALLOC])
    addr = np.array([0x1000_0000, 0x2000_0000, 0x1000_0000, 0x3000_0000], np.uint64)
    size = np.array([2, 2, 2, 4], np.uint64) * MiB
    ev = Events.build(op, size, addr=addr, rounded=np.where(op == Op.FREE, 0, size))
    return write_trace(tmp_path / "hole.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


def test_lower_bound_counts_the_fatal_oom_row_as_live(tmp_path: Path):
    """The last OOM (nothing allocated after it) is the fatal one and stays live; an OOM the
    program went on from is handled and not counted (tests/unit/test_sim_handled_oom.py)."""
    op = np.array([Op.MALLOC, Op.MALLOC, Op.OOM])
    ev = Events.build(op, np.array([1000, 100, 5000], np.uint64), addr=np.array([4096, 8192, 0], np.uint64))
    p = write_trace(tmp_path / "o.parquet", TraceMeta.new(Source.SYNTHETIC), ev)
    assert lower_bound(read_trace(p)) == 1024 + 512 + 5120
    handled = Events.build(op[[0, 2, 1]], np.array([1000, 5000, 100], np.uint64),
                           addr=np.array([4096, 0, 8192], np.uint64))
    q = write_trace(tmp_path / "h.parquet", TraceMeta.new(Source.SYNTHETIC), handled)
    assert lower_bound(read_trace(q)) == 1024 + 512


def test_hand_worked_capacities(hole_trace: Path):
    tr = read_trace(hole_trace)
    assert lower_bound(tr) == 6 * MiB
    ff = search(tr, "first-fit")
    assert ff.min_capacity == 8 * MiB and ff.overhead == 2 * MiB and ff.overhead_ratio == pytest.approx(1 / 3)
    assert search(tr, "best-fit").min_capacity == 8 * MiB
    cp = search(tr, "cupy")
    assert cp.min_capacity == 6 * MiB and cp.overhead == 0


def test_parallel_matches_serial_and_respects_max_capacity(hole_trace: Path):
    tr = read_trace(hole_trace)
    serial = whatif(tr, ["first-fit", "cupy"], jobs=1)
    parallel = whatif(tr, ["first-fit", "cupy"], jobs=2)
    expect = [8 * MiB, 6 * MiB]
    assert [f.min_capacity for f in serial.fits] == [f.min_capacity for f in parallel.fits] == expect
    capped = whatif(tr, ["first-fit", "cupy"], max_capacity=7 * MiB, jobs=1)
    assert [f.min_capacity for f in capped.fits] == [None, 6 * MiB]
    assert "> 7.00 MiB" in capped.to_text()


def test_cli_json_and_errors(hole_trace: Path, tmp_path: Path):
    args = ["whatif", str(hole_trace), "--policies", "first-fit,cupy", "--json", "-j", "1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["lower_bound_bytes"] == 6 * MiB
    assert d["lower_bound_description"].startswith("peak live bytes (512 B rounded)")
    r = CliRunner().invoke(app, [*args[:-3], "-j", "1"])
    assert "lower bound (peak live bytes, 512 B rounded): 6.00 MiB" in r.stdout
    got = {p["policy"]: p["min_capacity_bytes"] for p in d["policies"]}
    assert got == {"first-fit": 8 * MiB, "cupy": 6 * MiB}
    r = CliRunner().invoke(app, ["whatif", str(hole_trace), "--policies", "bestfit"])
    assert r.exit_code == 2 and "unknown policy 'bestfit'" in r.stderr
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 nope")
    p = subprocess.run([sys.executable, "-m", "tracekit", "whatif", str(bad)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert p.returncode == 1 and p.stderr.startswith("tracekit: error: ") and "Traceback" not in p.stderr


@pytest.mark.parametrize(("name", "policy"), [("cupy-oom-frag", "cupy"), ("torch-oom", "torch")])
def test_real_oom_traces_need_more_than_the_limit_they_failed_under(name: str, policy: str):
    # Each was recorded on an H200 and ran out of memory under its pool / process limit, so the
    # model of its own allocator must need more than that limit (and at least the lower bound).
    tr = read_trace(ROOT / "traces" / f"{name}.parquet")
    limit = tr.meta.pool_limit_bytes
    assert limit is not None
    fit = search(tr, policy)
    assert fit.min_capacity is not None and fit.min_capacity > limit >= 0
    assert fit.min_capacity >= fit.lower_bound


def test_torch_answer_is_the_smallest_capacity_replay_accepts():
    """torch-wrap starts from an imported pool state (the `initial` and `expandable` extra columns):
    whatif must replay what `replay --sim torch` replays, on one thread or several."""
    from tracekit.advise.capacity import STEP
    from tracekit.advise.replay import replay_file
    from tracekit.sim.base import SimConfig

    path = ROOT / "traces" / "torch-wrap.parquet"
    answers = []
    for jobs in ("1", "2"):
        args = ["whatif", str(path), "--policies", "torch,first-fit", "--json", "-j", jobs]
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        answers.append({p["policy"]: p["min_capacity_bytes"] for p in json.loads(r.stdout)["policies"]})
    assert answers[0] == answers[1]
    cap = answers[0]["torch"]
    assert cap is not None

    def fits(capacity: int) -> bool:
        """The replay gets through with its peak reserved within the capacity (advise's verdict is
        no fit where the headroom is negative, and whatif's smallest capacity is advise's)."""
        res = replay_file(path, "torch", SimConfig(capacity=capacity))
        return not res.ran_out and res.summary.peak_reserved_bytes <= capacity

    assert fits(cap)
    # The answer never undercuts the floor no allocator can beat (peak live bytes, 512 B rounded).
    r = CliRunner().invoke(app, ["whatif", str(path), "--policies", "torch", "--json"])
    doc = json.loads(r.stdout)
    assert cap >= doc["lower_bound_bytes"]
    assert cap - STEP < doc["lower_bound_bytes"] or not fits(cap - STEP)


def test_whatif_searches_each_device_on_its_own():
    # Device 0 holds 8 MiB at most; device 1 holds 240 MiB and asks for 60 MiB more (the oom
    # row counts as live): bounds 8 MiB and 300 MiB. Merged, device 1's blocks would land on
    # device 0's addresses and the bound would be 308 MiB.
    from test_analysis_ooms import trace_of, two_device_meta, two_device_rows

    res = whatif(trace_of(two_device_rows(), two_device_meta()), ["best-fit"], jobs=1)
    assert res.lower_bound is None and not res.fits
    assert [(p.device, p.lower_bound) for p in res.devices] == [(0, 8 * MiB), (1, 300 * MiB)]
    assert [p.fits[0].min_capacity for p in res.devices] == [8 * MiB, 300 * MiB]
    d = res.to_dict()
    assert [x["device"] for x in d["devices"]] == [0, 1] and d["policies"] == []
    assert "device 1:" in res.to_text()


def _replaced(path: Path, by: Path) -> None:
    """Replace ``path`` atomically with a copy of ``by`` (as a sync or an upload does)."""
    tmp = path.with_suffix(".new")
    tmp.write_bytes(by.read_bytes())
    tmp.replace(path)


def test_a_trace_replaced_after_the_read_changes_no_answer(hole_trace: Path, tmp_path: Path):
    """The searches replay the trace the command read, in its own threads: a file replaced at that
    path meanwhile (a sync, an upload) is never read again, so no answer mixes two traces."""
    tr = read_trace(hole_trace)
    before = whatif(tr, ["first-fit", "cupy"], jobs=1).to_dict()
    (tmp_path / "junk.parquet").write_bytes(b"not a trace at all")
    _replaced(hole_trace, tmp_path / "junk.parquet")
    assert whatif(tr, ["first-fit", "cupy"], jobs=2).to_dict() == before


def test_one_pool_of_threads_for_every_device(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Two devices, two policies, two threads: one pool, four searches, each device on its own,
    and no worker process."""
    import concurrent.futures as futures

    from test_analysis_ooms import trace_of, two_device_meta, two_device_rows

    started = []

    class Counting(futures.ThreadPoolExecutor):
        def __init__(self, *a: object, **kw: object) -> None:
            started.append(1)
            super().__init__(*a, **kw)  # type: ignore[arg-type]

    def no_process(*a: object, **kw: object) -> None:
        raise AssertionError("a what-if starts no worker process")

    monkeypatch.setattr(futures, "ThreadPoolExecutor", Counting)  # the one pool's executor
    monkeypatch.setattr(futures, "ProcessPoolExecutor", no_process)
    res = whatif(trace_of(two_device_rows(), two_device_meta()), ["best-fit", "first-fit"], jobs=2)
    assert len(started) == 1
    assert [[f.min_capacity for f in p.fits] for p in res.devices] == [[8 * MiB] * 2, [300 * MiB] * 2]


def test_unusable_recorded_settings_exit_1_as_replay_does(tmp_path: Path):
    """A PyTorch trace whose recorded allocator settings cannot be used: whatif, like replay,
    says so in one sentence naming the file and exits 1 (not an error row and exit 0)."""
    src = read_trace(ROOT / "traces" / "torch-record-oom.parquet")
    bad = tmp_path / "bad-settings.parquet"
    too_small = {"max_split_size": 5}  # bytes: PyTorch takes no max_split_size_mb below 20
    write_trace(bad, src.meta.with_extra(torch_allocator_settings=too_small), src.events)
    verbs = (["whatif", str(bad), "--policies", "torch", "-j", "1"], ["replay", str(bad), "--sim", "torch"])
    for verb in verbs:
        p = subprocess.run([sys.executable, "-m", "tracekit", *verb], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
        assert p.returncode == 1, (verb, p.stdout, p.stderr)
        last = p.stderr.strip().splitlines()[-1]
        assert last.startswith(f"tracekit: error: {bad}: the recorded PyTorch allocator settings are not "
                               "usable") and "Traceback" not in p.stderr


@pytest.mark.parametrize(("name", "options"), [("torch-oom", {"expandable_segments": "True"}),
                                               ("torch-maxsplit", {"max_split_size_mb": "64"}),
                                               ("cupy-oom-frag", {})])
def test_replay_whatif_and_advise_give_one_prediction(name: str, options: dict[str, str]):
    """One setting, three verbs: ``replay --sim`` at the limit says what ``advise`` says of the
    candidate (fits, peak reserved), and ``whatif``'s smallest capacity is where ``replay``
    starts to fit (it fits there and fails 2 MiB below)."""
    from tracekit.advise import candidates as cands
    from tracekit.advise.capacity import STEP
    from tracekit.advise.counterfactual import prepare, setting
    from tracekit.advise.evaluate import evaluate
    from tracekit.advise.replay import replay_file
    from tracekit.sim.base import SimConfig

    path = ROOT / "traces" / f"{name}.parquet"
    tr = read_trace(path)
    policy = "torch" if name.startswith("torch") else "cupy"
    limit = tr.meta.pool_limit_bytes
    whole = setting(tr, policy, options)  # what the options stand for on this recording
    cand = cands.torch(whole) if policy == "torch" else cands.Candidate(cands.Kind.CUPY_POOL, "cupy")
    adv = evaluate(cand, prepare(tr), limit, None)
    rep = replay_file(path, policy, SimConfig(capacity=limit, options=options)).summary
    assert (rep.oom is None, rep.peak_reserved_bytes) == (adv.fits, adv.peak_reserved)
    fit = search(prepare(tr), policy, options=whole, counterfactual=True)
    assert fit.min_capacity is not None
    assert not replay_file(path, policy, SimConfig(capacity=fit.min_capacity, options=options)).ran_out
    below = fit.min_capacity - STEP
    assert below < fit.lower_bound or replay_file(
        path, policy, SimConfig(capacity=below, options=options)).ran_out
    r = CliRunner().invoke(app, ["whatif", str(path), "--policies", policy, "--json", "-j", "1"])
    if not options:  # whatif searches the recorded setting: the same answer
        assert json.loads(r.stdout)["policies"][0]["min_capacity_bytes"] == fit.min_capacity


def test_a_trace_holding_nothing_is_answered_in_text(tmp_path):
    """Zero events: every smallest capacity is 0 over a bound of 0, with no ratio to print."""
    from tracekit.trace import Events, Source, TraceMeta, write_trace

    path = write_trace(tmp_path / "empty.parquet", TraceMeta.new(Source.SYNTHETIC),
                       Events.build(np.zeros(0, np.int8), np.zeros(0, np.uint64)))
    r = CliRunner().invoke(app, ["whatif", str(path), "--policies", "best-fit,torch"])
    assert r.exit_code == 0, r.output
    assert "best-fit" in r.stdout and "+0 bytes" in r.stdout
