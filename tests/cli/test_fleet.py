"""``tracekit fleet``: rows that agree with the single-trace engine, the summary across ranks, bad members.

The fleet is a folder of the project's real traces (``traces/``), synthetic
traces, two hand-built ranks of one job (rank 1 runs out of memory through
fragmentation, rank 0 does not) and a corrupt file. Every row is checked
against ``analyze_trace`` on the same file; the hand-built ranks have worked
answers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

try:  # tracekit fleet's table; the module skips, saying why, without it
    import polars as pl
except ImportError:
    pytest.skip("polars is the 'fleet' extra: pip install -e '.[fleet]'", allow_module_level=True)
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.analysis import analyze_trace
from tracekit.cli.app import app
from tracekit.fleet import Engine, FleetOptions, run_fleet
from tracekit.fleet.inputs import expand_paths
from tracekit.fleet.member import reserved_curve
from tracekit.fleet.row import RankFrom, launch_fields, rank_from_name
from tracekit.synth import Pattern, synthesize
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, read_trace, write_trace

ROOT = Path(__file__).resolve().parents[2]
MiB = 1 << 20
BASE = 0x7F0000000000


def rank_trace(path: Path, rank: int, *, oom: bool, survive: bool = False) -> Path:
    """One rank of a 2-rank job: an 8 MiB segment, three 2 MiB blocks, two of them freed.

    Free afterwards: [0, 2) and [4, 8) MiB of the segment, 6 MiB in all, the largest
    piece 4 MiB. With ``oom`` a 5 MiB request then fails: 6 MiB free ≥ 5 MiB > 4 MiB,
    so the diagnosis is fragmentation. With ``survive`` the program then allocates 1 MiB
    successfully, so it survived that OOM (a handled one).
    """
    ops = [Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE]
    size = [8 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB, 2 * MiB]
    addr = [BASE, BASE, BASE + 2 * MiB, BASE + 4 * MiB, BASE, BASE + 4 * MiB]
    if oom:
        ops.append(Op.OOM)
        size.append(5 * MiB)
        addr.append(0)
    if survive:
        ops.append(Op.MALLOC)
        size.append(MiB)
        addr.append(BASE + 6 * MiB)
    n = len(ops)
    ev = Events.build(np.array(ops, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64),
                      rounded=np.array(size, np.uint64), t_ns=np.arange(n, dtype=np.int64) * 1000,
                      site=np.array([-1, 0, 0, 0, -1, -1] + [1] * (n - 6), np.int32),
                      sites=("train.py:10:forward", "train.py:20:backward"))
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("NVIDIA H200", 140 * 1024 * MiB, 139 * 1024 * MiB),
                         pool_limit_bytes=8 * MiB).with_extra(
        launch={"rank": rank, "local_rank": rank, "world_size": 2, "host": "node0", "pid": 100 + rank})
    write_trace(path, meta, ev)
    return path


@pytest.fixture(scope="session")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real traces, two synthetic ones, two hand-built ranks (their file names say nothing) and a bad file."""
    d = tmp_path_factory.mktemp("fleet")
    for name in ("cupy-oom-frag", "cupy-fft", "torch-oom", "torch-wrap"):
        shutil.copy(ROOT / "traces" / f"{name}.parquet", d / f"{name}.parquet")
    synthesize(Pattern.TRAINING, 3000, 1, d / "synth-training.parquet")
    synthesize(Pattern.FRAGMENTING, 3000, 2, d / "synth-fragmenting.parquet")
    rank_trace(d / "job-a.parquet", 0, oom=False)
    rank_trace(d / "job-b.parquet", 1, oom=True)
    (d / "corrupt.parquet").write_bytes(b"PAR1 this is not a trace at all")
    return d


@pytest.fixture(scope="session")
def local_result(fleet_dir: Path):
    return run_fleet([fleet_dir], FleetOptions(engine=Engine.LOCAL, jobs=2))


def test_every_row_is_the_single_trace_engines_answer(fleet_dir: Path, local_result) -> None:
    rows = {Path(r["path"]).name: r for r in local_result.table.to_dicts()}
    assert len(rows) == 9
    for name, r in rows.items():
        if name == "corrupt.parquet":
            continue
        s = analyze_trace(read_trace(fleet_dir / name), timeline=False).summary
        assert r["error"] is None
        assert (r["events"], r["peak_live_bytes"], r["peak_live_seq"]) == (s.events, s.peak_live_bytes,
                                                                          s.peak_live_seq)
        assert (r["peak_reserved_bytes"], r["peak_reserved_seq"]) == (s.peak_reserved_bytes,
                                                                      s.peak_reserved_seq)
        assert r["max_external_fragmentation"] == pytest.approx(s.max_external_fragmentation)
        assert r["oom_count"] == s.oom_events and r["leaked_bytes"] == s.leaked_bytes
        fatal = s.oom if s.oom is not None and not s.oom.handled else None
        assert r["oom_seq"] == (fatal.seq if fatal else None)
        assert r["oom_diagnosis"] == (fatal.diagnosis.value if fatal else None)
        assert r["ooms_handled"] == sum(o.handled for o in s.ooms)
        assert r["duration_s"] == pytest.approx(s.duration_s)


def test_a_corrupt_member_is_reported_in_its_row_and_the_others_finish(local_result) -> None:
    df = local_result.table
    bad = df.filter(pl.col("error").is_not_null())
    assert bad.get_column("path").to_list()[0].endswith("corrupt.parquet")
    assert "not a readable Parquet file" in bad.get_column("error")[0]
    assert df.filter(pl.col("error").is_null()).height == 8
    assert local_result.summary.errors[0][0].endswith("corrupt.parquet")


def test_two_ranks_worked_answer(local_result) -> None:
    df = local_result.table
    ranks = df.filter(pl.col("rank").is_not_null())
    # Ranks from the launch metadata, sorted first; the file names carry none.
    assert ranks.get_column("rank").to_list() == [0, 1]
    assert df.get_column("rank").to_list()[:2] == [0, 1]
    r1 = ranks.row(1, named=True)
    assert (r1["rank_from"], r1["world_size"], r1["host"]) == ("launch", 2, "node0")
    assert (r1["oom_seq"], r1["oom_size"], r1["oom_diagnosis"]) == (6, 5 * MiB, "fragmentation")
    assert r1["oom_site"] == "train.py:20:backward"
    peaks = (r1["peak_live_bytes"], r1["peak_reserved_bytes"], r1["leaked_bytes"])
    assert peaks == (6 * MiB, 8 * MiB, 2 * MiB)
    # 1 - largest free / free: after the first free [0, 2) and [6, 8) are free: 1 - 2/4;
    # after the second, [0, 2) and [4, 8): 1 - 4/6. The maximum is the first.
    assert r1["max_external_fragmentation"] == pytest.approx(1 - 2 / 4)
    s = local_result.summary
    frag = next(g for g in s.by_diagnosis if g.key == "fragmentation")
    assert 1 in frag.ranks and frag.traces == 2  # rank 1 and cupy-oom-frag
    site = next(g for g in s.by_site if g.key == "train.py:20:backward")
    assert site.ranks == (1,) and site.traces == 1
    im = s.imbalance
    assert im is not None
    assert (im.over, im.count, im.max_bytes, im.median_bytes) == ("ranks", 2, 8 * MiB, 8 * MiB)


def test_a_survived_oom_is_counted_not_reported_as_the_failure(tmp_path: Path) -> None:
    path = rank_trace(tmp_path / "ddp.rank3.parquet", 3, oom=True, survive=True)
    res = run_fleet([path], FleetOptions(jobs=1))
    r = res.table.row(0, named=True)
    assert (r["oom_count"], r["ooms_handled"], r["oom_seq"], r["oom_diagnosis"]) == (1, 1, None, None)
    assert res.summary.out_of_memory == 0 and res.summary.by_diagnosis == ()


def test_a_two_device_trace_gives_the_failing_devices_figures(tmp_path: Path) -> None:
    # Device 0 takes a 64 MiB segment and a 32 MiB block; device 1 an 8 MiB segment, a 6 MiB
    # block, then a 4 MiB request that fails there (the program stops).
    ops = [Op.SEGMENT_ALLOC, Op.MALLOC, Op.SEGMENT_ALLOC, Op.MALLOC, Op.OOM]
    size = [64 * MiB, 32 * MiB, 8 * MiB, 6 * MiB, 4 * MiB]
    addr = [BASE, BASE, BASE + (1 << 32), BASE + (1 << 32), 0]
    ev = Events.build(np.array(ops, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64),
                      rounded=np.array(size, np.uint64), device=np.array([0, 0, 1, 1, 1], np.int16))
    path = tmp_path / "two-devices.parquet"
    write_trace(path, TraceMeta.new(Source.CUPY, pool_limit_bytes=8 * MiB), ev)
    r = run_fleet([path], FleetOptions(jobs=1)).table.row(0, named=True)
    assert (r["device_index"], r["oom_device"], r["oom_seq"]) == (1, 1, 4)
    assert (r["peak_reserved_bytes"], r["peak_live_bytes"]) == (8 * MiB, 6 * MiB)


def test_the_device_budget_at_the_fatal_oom_names_what_took_the_memory(tmp_path: Path) -> None:
    # The analyzer's seed scenario (tests/unit/test_analysis_budget.py): another process holds 133.80 GiB,
    # this process holds its context plus 3,960 MiB of local memory outside the pool, and the
    # device had 122,978,304 B free when the 512 MiB request failed.
    from test_analysis_budget import CONTEXT, LOCAL_GROWTH, OTHER, seed_trace

    t = seed_trace()
    path = tmp_path / "seed.rank0.parquet"
    assert t.extras is not None
    write_trace(path, t.meta, t.events, extras={"device_free": t.extras["device_free"].combine_chunks()})
    r = run_fleet([path], FleetOptions(jobs=1)).table.row(0, named=True)
    assert (r["oom_device_free_bytes"], r["oom_device_free_source"]) == (122_978_304, "measured")
    assert r["oom_other_processes_bytes"] == OTHER
    assert r["oom_outside_pool_bytes"] == CONTEXT + LOCAL_GROWTH
    assert (r["rank"], r["rank_from"]) == (0, "file name")


def test_summary_worst_trace_and_counts(local_result) -> None:
    s = local_result.summary
    assert (s.traces, s.analyzed, s.out_of_memory) == (9, 8, 3)
    assert {g.key: g.traces for g in s.by_diagnosis} == {"fragmentation": 2, "limit": 1}
    # Traces that ran out come first, then the highest peak reserved: torch-oom (14 GiB).
    assert s.worst is not None and s.worst.path.endswith("torch-oom.parquet")
    cmd = s.worst.report_command
    assert cmd.startswith("tracekit report ") and cmd.endswith("-o torch-oom.html")
    text = s.to_text()
    assert "3 ran out of memory" in text and "worst:" in text and "corrupt.parquet" in text


def test_rank_from_file_name_and_metadata(tmp_path: Path) -> None:
    assert rank_from_name(Path("ddp.rank0.parquet")) == 0
    assert rank_from_name(Path("run-rank_12.parquet")) == 12
    assert rank_from_name(Path("Rank-3-of-8.parquet")) == 3
    assert rank_from_name(Path("frank7.parquet")) is None
    assert rank_from_name(Path("cupy-mlp.parquet")) is None
    p = rank_trace(tmp_path / "ddp.rank5.parquet", 2, oom=False)
    got, came = launch_fields(p, read_trace(p).meta)
    assert (got.rank, came) == (2, RankFrom.LAUNCH)  # the metadata wins over the name
    assert (got.local_rank, got.world_size, got.host, got.pid) == (2, 2, "node0", 102)
    bare = TraceMeta.new(Source.SYNTHETIC)
    got, came = launch_fields(Path("x.rank4.parquet"), bare)
    assert (got.rank, came, got.world_size) == (4, RankFrom.FILE_NAME, None)


def test_reserved_curve_worked_example() -> None:
    # One event a second; reserved 0, 10, 30 (a spike at 2 s), 5, 5, 5, 8. Twelve columns of 0.5 s:
    # a column holds the highest value it sees, counting the value carried in (the column starting
    # at 3 s still holds the 30 until the event at 3 s lowers it); an empty column holds what was left.
    t = np.arange(7, dtype=np.int64) * 1_000_000_000
    seq = np.arange(7, dtype=np.uint64)
    res = np.array([0, 10, 30, 5, 5, 5, 8], np.int64)
    c = reserved_curve(t, seq, res, 12, oom_seq=3)
    assert c.reserved.tolist() == [0, 0, 10, 10, 30, 30, 30, 5, 5, 5, 5, 8]
    assert c.oom_at == pytest.approx(3 / 6)
    assert reserved_curve(t[:0], seq[:0], res[:0], 4).reserved.tolist() == [0, 0, 0, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1 << 40)), min_size=1, max_size=60),
       st.integers(1, 40))
def test_reserved_curve_hides_no_peak_and_invents_no_value(steps: list[tuple[int, int]], bins: int) -> None:
    # Any step curve (gaps between events in ms, reserved bytes after each event): the heat-map
    # row has ``bins`` cells, its highest cell is the curve's peak, every cell is a value the
    # curve took, and the last cell holds the last value (it is at least that).
    t = np.cumsum([g for g, _ in steps]).astype(np.int64) * 1_000_000
    y = np.array([v for _, v in steps], np.int64)
    c = reserved_curve(t, np.arange(len(y), dtype=np.uint64), y, bins).reserved
    assert len(c) == bins and c.max() == y.max()
    assert set(c.tolist()) <= set(y.tolist())
    assert c[-1] >= y[-1]


def test_reserved_curve_falls_back_to_event_index_after_a_long_pause() -> None:
    # A 6 s pause in a 9 s trace: like the report's timeline, x becomes the event index 0..4.
    t = np.array([0, 1, 2, 3, 9], np.int64) * 1_000_000_000
    c = reserved_curve(t, np.arange(5, dtype=np.uint64), np.array([0, 10, 30, 5, 5], np.int64), 3, oom_seq=3)
    assert c.reserved.tolist() == [10, 30, 30] and c.oom_at == pytest.approx(3 / 4)


def test_paths_folder_glob_and_file_each_once(fleet_dir: Path, tmp_path: Path) -> None:
    got = expand_paths([fleet_dir / "job-a.parquet", str(fleet_dir / "job-*.parquet"), fleet_dir])
    names = [p.name for p in got]
    assert names[:2] == ["job-a.parquet", "job-b.parquet"] and len(names) == len(set(names)) == 9
    from tracekit.errors import InputError

    with pytest.raises(InputError, match=r"holds no \.parquet"):
        expand_paths([tmp_path])
    with pytest.raises(InputError, match="no file matches"):
        expand_paths([str(tmp_path / "*.parquet")])


runner = CliRunner()


def test_cli_json_parquet_and_report(fleet_dir: Path, tmp_path: Path) -> None:
    out, rep = tmp_path / "fleet.parquet", tmp_path / "fleet.html"
    members = [str(fleet_dir / "job-*.parquet"), str(fleet_dir / "cupy-oom-frag.parquet")]
    args = ["--jobs", "1", "--json", "-o", str(out), "--report", str(rep)]
    res = runner.invoke(app, ["fleet", *members, *args])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["rank"] for r in doc["rows"]] == [0, 1, None]
    assert doc["summary"]["worst"]["rank"] == 1 or doc["summary"]["worst"]["path"].endswith("frag.parquet")
    table = pl.read_parquet(out)
    assert table.height == 3 and table.get_column("reserved_curve").list.len().to_list() == [240] * 3
    assert table.drop("reserved_curve", "oom_at", "seconds").to_dicts() == [
        {k: v for k, v in r.items() if k != "seconds"} for r in doc["rows"]]
    page = rep.read_text()
    assert "Content-Security-Policy" in page and 'id="heatmap"' in page and 'id="worst-1"' in page
    assert page.count("<img ") >= 3 + 3  # peaks, outcomes, heat map, and the worst traces' figures
    assert "http://" not in page.replace("http://www.w3.org", "")


def test_whatif_columns_are_the_single_trace_search(fleet_dir: Path) -> None:
    from tracekit.advise.capacity import whatif

    res = run_fleet([fleet_dir / "job-b.parquet"], FleetOptions(jobs=1, whatif=True))
    row = res.table.row(0, named=True)
    want = whatif(read_trace(fleet_dir / "job-b.parquet"), jobs=1)
    assert row["whatif_lower_bound_bytes"] == want.lower_bound
    for fit in want.fits:
        assert row[f"min_capacity_{fit.policy.replace('-', '_')}_bytes"] == fit.min_capacity


def test_advise_column_is_the_advise_engines_recommendation(fleet_dir: Path) -> None:
    from tracekit.advise.run import advise

    members = [fleet_dir / "job-b.parquet", fleet_dir / "synth-training.parquet"]
    df = run_fleet(members, FleetOptions(jobs=1, advise=True)).table
    rank1, synth = df.row(0, named=True), df.row(1, named=True)
    want = advise(read_trace(members[0]), jobs=1).recommendation()
    assert rank1["recommendation"] == want and rank1["advise_error"] is None
    # A synthetic trace records no limit and no device: its row says so, and keeps its figures.
    assert synth["recommendation"] is None and "no limit" in synth["advise_error"]
    assert synth["error"] is None and synth["events"] == 3000


def test_cli_text_names_the_failing_rank(fleet_dir: Path) -> None:
    res = runner.invoke(app, ["fleet", str(fleet_dir / "job-a.parquet"), str(fleet_dir / "job-b.parquet"),
                              "--jobs", "1"])
    assert res.exit_code == 0, res.output
    assert "fragmentation at seq 6" in res.stdout and "(rank 1)" in res.stdout


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", "fleet", *args], capture_output=True, text=True,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})


def test_exit_codes_through_a_process(fleet_dir: Path, tmp_path: Path) -> None:
    bad_engine = _run(str(fleet_dir), "--engine", "spark")
    assert bad_engine.returncode == 2 and "choose local or ray" in bad_engine.stderr
    assert "Traceback" not in bad_engine.stderr
    member = fleet_dir / "job-a.parquet"
    before = member.read_bytes()
    clash = _run(str(fleet_dir), "-o", str(member))
    assert clash.returncode == 1 and "names one of the traces" in clash.stderr  # bad output, as every verb
    assert member.read_bytes() == before
    existing = tmp_path / "old.parquet"
    existing.write_bytes(b"keep me")
    kept = _run(str(member), "-o", str(existing))
    assert kept.returncode == 1 and "--force" in kept.stderr and existing.read_bytes() == b"keep me"


def test_cli_with_a_bad_member_writes_everything_then_exits_1(fleet_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "all.parquet"
    res = runner.invoke(app, ["fleet", str(fleet_dir), "--json", "-o", str(out), "--jobs", "1"])
    assert res.exit_code == 1
    assert "1 of 9 traces could not be analyzed" in res.stderr and "corrupt.parquet" in res.stderr
    rows = json.loads(res.stdout)["rows"]
    assert len(rows) == 9 and sum(r["error"] is not None for r in rows) == 1
    assert pl.read_parquet(out).height == 9


def test_usage_and_input_errors(fleet_dir: Path, tmp_path: Path) -> None:
    address = runner.invoke(app, ["fleet", str(fleet_dir), "--address", "127.0.0.1:6379"])
    assert address.exit_code == 2 and "--engine ray" in address.stderr
    empty = runner.invoke(app, ["fleet", str(tmp_path)])
    assert empty.exit_code == 1 and "holds no .parquet trace" in empty.stderr
    existing = tmp_path / "old.parquet"
    existing.write_bytes(b"replace me")
    forced = runner.invoke(app, ["fleet", str(fleet_dir / "job-a.parquet"), "-o", str(existing), "--force",
                                 "--jobs", "1"])
    assert forced.exit_code == 0 and pl.read_parquet(existing).height == 1


def _exit_on(k: int, x: int) -> int:
    """A task whose worker dies on ``x == k`` (as one killed for memory would)."""
    import os

    if x == k:
        os._exit(9)
    return x * 10


def test_a_worker_that_dies_fails_its_own_task_only_and_the_pool_is_rebuilt() -> None:
    from tracekit.fleet.engines import LocalRunner

    runner = LocalRunner(2)
    try:
        got = dict(runner.map(_exit_on, [(2, x) for x in range(6)], lambda i, e: f"died: {type(e).__name__}"))
        again = dict(runner.map(_exit_on, [(-1, x) for x in range(3)], lambda i, e: "died"))
    finally:
        runner.close()
    # task 2 kills its worker every time; the tasks that shared the broken pool ran again and finished
    assert got == {0: 0, 1: 10, 2: "died: BrokenProcessPool", 3: 30, 4: 40, 5: 50}
    assert again == {0: 0, 1: 10, 2: 20}  # a later phase gets a working pool


def test_a_worst_trace_that_cannot_be_drawn_leaves_its_reason_on_the_page(fleet_dir: Path) -> None:
    from tracekit.fleet.member import render_member
    from tracekit.fleet.report import _worst_sections

    why = render_member(str(fleet_dir / "corrupt.parquet"))
    assert isinstance(why, str) and "corrupt.parquet" in why
    (section,) = _worst_sections([(str(fleet_dir / "corrupt.parquet"), why)])
    assert "could not be drawn" in section and 'id="worst-1"' in section


def test_a_second_fleet_over_the_folder_passes_its_first_table_by(tmp_path: Path) -> None:
    cli_app = app
    for name in ("cupy-oom-frag.parquet", "torch-oom.parquet"):
        shutil.copy(ROOT / "traces" / name, tmp_path / name)
    for out in ("fleet.parquet", "fleet2.parquet"):
        r = CliRunner().invoke(cli_app, ["fleet", str(tmp_path), "-o", str(tmp_path / out), "--jobs", "1"])
        assert r.exit_code == 0, r.output
        assert "2 traces: 2 analyzed" in r.output
    r = CliRunner().invoke(cli_app, ["fleet", str(tmp_path / "*.parquet"), "--jobs", "1"])
    assert r.exit_code == 0 and "2 traces: 2 analyzed" in r.output, r.output
