"""``tracekit fleet`` under hostile members and options: every other member finishes, one sentence each.

Members built here, each a 2-event trace (one 1 KiB malloc and its free, so
every figure is known): ranks beyond int64 in the file name and in the
``launch`` metadata, a device name that is not text, a file name that is not
UTF-8, ``$`` and terminal escapes in names (with ``--report``), seq numbers
near 2^64, and one file reached by three names (a hard link, a symbolic
link, a ``..``). Then ``--address`` values that used to hang or end in a
traceback, and ``--jobs`` far beyond the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

try:  # tracekit fleet's table; the module skips, saying why, without it
    import polars as pl
except ImportError:
    pytest.skip("polars is the 'fleet' extra: pip install -e '.[fleet]'", allow_module_level=True)
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import UsageError
from tracekit.fleet.engines import Address, parse_address
from tracekit.fleet.inputs import expand_paths
from tracekit.fleet.row import TraceRow
from tracekit.fleet.table import rows_frame
from tracekit.trace.events import Events
from tracekit.trace.schema import DeviceInfo, Op, Source, TraceMeta
from tracekit.trace.writer import write_trace

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()
BIG = 2**70  # beyond int64 and uint64


def _trace(path: Path, meta: TraceMeta, *, kib: int = 1, seq: np.ndarray | None = None) -> Path:
    """A 2-event trace: malloc ``kib`` KiB at 0 from ``a.py:1:f``, then free it."""
    ev = Events.build(np.array([Op.MALLOC, Op.FREE], np.int8), np.full(2, kib << 10, np.uint64),
                      addr=np.zeros(2, np.uint64), site=np.zeros(2, np.int32), sites=("a.py:1:f",), seq=seq)
    tmp = path.with_name("writing.tmp")
    write_trace(tmp, meta, ev)
    os.rename(tmp, path)  # by bytes too: Arrow cannot open a name that is not UTF-8 for writing
    return path


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("odd")
    base = TraceMeta.new(Source.SYNTHETIC)
    _trace(d / "ok.rank0.parquet", base)
    _trace(d / "job.rank99999999999999999999.parquet", base)
    _trace(d / "launch.parquet", base.with_extra(launch={"rank": BIG, "world_size": BIG, "local_rank": -5}))
    not_text: Any = {"x": 1}
    _trace(d / "device.parquet", TraceMeta.new(Source.SYNTHETIC, device=DeviceInfo(not_text, 1 << 30)))
    _trace(Path(os.fsdecode(os.fsencode(d) + b"/bytes\xff.parquet")), base, kib=2)
    _trace(d / "a$b.parquet", base, kib=3)
    _trace(d / "esc\x1b]0;owned\x07.parquet", base)
    _trace(d / "seq.parquet", base, seq=np.array([2**64 - 3, 2**64 - 2], np.uint64))
    return d


def test_every_odd_member_gets_its_row_and_the_fleet_finishes(odd: Path, tmp_path: Path) -> None:
    out, rep = tmp_path / "fleet.parquet", tmp_path / "fleet.html"
    res = runner.invoke(app, ["fleet", str(odd), "--jobs", "1", "--json", "-o", str(out),
                              "--report", str(rep)])
    assert res.exit_code == 0, res.output
    rows = {Path(r["path"]).name: r for r in json.loads(res.stdout)["rows"]}
    assert len(rows) == 8 and all(r["error"] is None for r in rows.values())
    assert rows["ok.rank0.parquet"]["rank"] == 0
    # beyond int64: no rank, in the name or in the metadata (and no local rank or world size)
    assert rows["job.rank99999999999999999999.parquet"]["rank"] is None
    launch = rows["launch.parquet"]
    assert (launch["rank"], launch["world_size"], launch["local_rank"]) == (None, None, None)
    assert rows["device.parquet"]["device"] is None and rows["device.parquet"]["peak_live_bytes"] == 1024
    assert rows["bytes\\udcff.parquet"]["peak_live_bytes"] == 2048  # stored as repr writes the byte
    assert rows["seq.parquet"]["peak_live_seq"] == 2**64 - 3
    table = pl.read_parquet(out)
    assert table.height == 8 and table.schema["peak_live_seq"] == pl.UInt64
    page = rep.read_text()
    # the worst trace is a$b (3 KiB), then the non-UTF-8 one (2 KiB): both drawn, by their own names
    assert 'id="worst-1"' in page and "a$b.parquet" in page and "could not be drawn" not in page
    assert "\x1b" not in page and "\x1b" not in res.stdout


def test_text_output_escapes_names_and_keeps_columns(odd: Path) -> None:
    res = runner.invoke(app, ["fleet", str(odd), "--jobs", "1"])
    assert res.exit_code == 0, res.output
    assert "\x1b" not in res.stdout and "\x07" not in res.stdout
    lines = [ln for ln in res.stdout.splitlines() if ".parquet" in ln and "  " in ln][:8]
    assert "esc\\x1b]0;owned\\x07.parquet" in res.stdout
    # every row's "events" column ends at the same place: names were escaped before measuring
    ends = {ln.index(" 2 ") for ln in lines if " 2 " in ln}
    assert len(ends) == 1, lines


def test_a_value_that_fits_no_column_becomes_that_members_error_row() -> None:
    good = TraceRow(path="good.parquet", events=2, peak_live_bytes=1024)
    bad = TraceRow(path="bad.parquet", events=2, peak_live_bytes=BIG)
    text = TraceRow(path="text.parquet", events=2, device=7)  # type: ignore[arg-type]
    df = rows_frame([good, bad, text])
    by = {r["path"]: r for r in df.iter_rows(named=True)}
    assert by["good.parquet"]["error"] is None and by["good.parquet"]["peak_live_bytes"] == 1024
    assert by["bad.parquet"]["error"] == (f"bad.parquet: its peak_live_bytes, {BIG}, does not fit the "
                                          "table's Int64 column")
    assert by["bad.parquet"]["peak_live_bytes"] is None
    assert "its device, 7," in by["text.parquet"]["error"]


def test_one_file_by_many_names_is_one_member(tmp_path: Path) -> None:
    a = _trace(tmp_path / "a.parquet", TraceMeta.new(Source.SYNTHETIC))
    os.link(a, tmp_path / "hard.parquet")
    (tmp_path / "soft.parquet").symlink_to(a)
    (tmp_path / "sub").mkdir()
    again = tmp_path / "sub" / ".." / "a.parquet"
    members = expand_paths([str(tmp_path), str(again), str(tmp_path / "hard.parquet")])
    assert members == [a]  # the folder lists a.parquet first (sorted); the rest are the same inode
    missing = tmp_path / "gone.parquet"
    assert expand_paths([str(missing), str(tmp_path / "sub" / ".." / "gone.parquet")]) == [missing]


@pytest.mark.parametrize(("address", "says"), [
    ("localhost:-1", "port must be a number from 1 to 65535"),
    ("localhost:0", "port must be a number from 1 to 65535"),
    ("localhost:65536", "port must be a number from 1 to 65535"),
    ("localhost:６３７９", "port must be a number"),  # fullwidth digits: isdigit, not a port
    ("localhost", "give HOST:PORT"),
    (":6379", "give HOST:PORT"),
    ("http://head:6379", "give HOST:PORT"),
    ("a" * 300 + ":6379", "the host name is 300 characters"),
    ("bad host:6379", "letters, digits"),
    ("a..b:6379", "letters, digits"),
    ("[::zz]:6379", "is not an IPv6 address"),
    ("ray://" + "b" * 300 + ":10001", "the host name is 300 characters"),
])
def test_a_malformed_address_is_a_usage_error_before_ray(address: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse_address(address)


def test_well_formed_addresses_parse() -> None:
    assert parse_address("auto") is None
    assert parse_address("10.0.0.1:6379") == Address(False, "10.0.0.1", 6379)
    assert parse_address("head-1.cluster_1.local:6379") == Address(False, "head-1.cluster_1.local", 6379)
    assert parse_address("[::1]:6379") == Address(False, "::1", 6379)
    assert parse_address("ray://head:10001") == Address(True, "head", 10001)


def _fleet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracekit", "fleet", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_bad_addresses_end_at_once_with_one_sentence(odd: Path) -> None:
    for address in ("localhost:-1", "a" * 300 + ":6379", "[::1:6379"):
        t0 = time.monotonic()
        res = _fleet(str(odd / "ok.rank0.parquet"), "--engine", "ray", "--address", address, timeout=60)
        assert res.returncode == 2 and res.stderr.startswith("tracekit: error: --address"), res.stderr
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
        assert time.monotonic() - t0 < 30


def test_ray_client_address_without_the_client_extra(odd: Path) -> None:
    pytest.importorskip("ray", reason="Ray is the 'ray' extra: pip install -e '.[ray]'")
    import importlib.util

    if importlib.util.find_spec("grpc") is not None:
        pytest.skip("Ray's client (grpcio) is installed here; nothing to refuse")
    res = _fleet(str(odd / "ok.rank0.parquet"), "--engine", "ray", "--address", "ray://127.0.0.1:10001")
    assert res.returncode == 2 and "pip install 'ray[client]'" in res.stderr and "Traceback" not in res.stderr


def test_nobody_answering_is_one_sentence_in_seconds(odd: Path) -> None:
    pytest.importorskip("ray", reason="Ray is the 'ray' extra: pip install -e '.[ray]'")
    t0 = time.monotonic()
    res = _fleet(str(odd / "ok.rank0.parquet"), "--engine", "ray", "--address", "127.0.0.1:1", timeout=60)
    assert res.returncode == 1 and "no Ray cluster answers there" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and time.monotonic() - t0 < 30


def test_jobs_far_beyond_the_machine_runs_on_the_cpus(odd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _fleet(str(odd), "--jobs", "99999999999", "--json")
    assert res.returncode == 0 and len(json.loads(res.stdout)["rows"]) == 8, res.stderr
    # The pool the driver opens: the real engine, its worker count recorded on the way in.
    from tracekit import workers
    from tracekit.fleet import run

    opened: list[int] = []
    real = run.open_engine

    def recording(engine, jobs, address=None):  # type: ignore[no-untyped-def]
        opened.append(jobs)
        return real(engine, jobs, address)

    monkeypatch.setattr(run, "open_engine", recording)
    monkeypatch.setattr(workers, "usable_cpus", lambda: 2)
    run.run_fleet([odd], run.FleetOptions(jobs=100))
    monkeypatch.setattr(workers, "available_memory", lambda: 600 << 20)  # room for one 512 MiB worker
    run.run_fleet([odd], run.FleetOptions(jobs=100))
    assert opened == [2, 1]
