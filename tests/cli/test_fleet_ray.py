"""``tracekit fleet --engine ray``: Ray tasks give the same rows as local processes, bad members included.

One local Ray instance (2 CPUs) serves the whole module, since Ray takes
seconds to start; ``run_fleet`` uses an instance that is already running
and leaves it running. The fleet is small: two real traces, one synthetic,
two hand-built ranks and a corrupt file.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

try:  # tracekit fleet's table; the module skips, saying why, without it
    import polars as pl
except ImportError:
    pytest.skip("polars is the 'fleet' extra: pip install -e '.[fleet]'", allow_module_level=True)
from test_fleet import ROOT, rank_trace

from tracekit.fleet import Engine, FleetOptions, run_fleet
from tracekit.synth import Pattern, synthesize

ray = pytest.importorskip("ray", reason="Ray is the 'ray' extra: pip install -e '.[ray]'")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=128 << 20)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("fleet-ray")
    for name in ("cupy-oom-frag", "torch-wrap"):
        shutil.copy(ROOT / "traces" / f"{name}.parquet", d / f"{name}.parquet")
    synthesize(Pattern.RANDOM, 2000, 3, d / "synth-random.parquet")
    rank_trace(d / "ddp.rank0.parquet", 0, oom=False)
    rank_trace(d / "ddp.rank1.parquet", 1, oom=True)
    (d / "truncated.parquet").write_bytes((ROOT / "traces" / "cupy-fft.parquet").read_bytes()[:5000])
    return d


def _comparable(df: pl.DataFrame) -> list[dict]:
    return df.drop("seconds").to_dicts()  # everything but the time each worker took


def test_ray_and_local_engines_agree(ray_session, fleet_dir: Path, tmp_path: Path) -> None:
    local = run_fleet([fleet_dir], FleetOptions(engine=Engine.LOCAL, jobs=1))
    remote = run_fleet([fleet_dir], FleetOptions(engine=Engine.RAY, jobs=2, report=tmp_path / "f.html"))
    assert ray.is_initialized()  # an instance it did not start is left running
    assert _comparable(remote.table.drop("reserved_curve", "oom_at")) == _comparable(local.table)
    assert remote.summary == local.summary
    assert remote.table.height == 6 and remote.summary.out_of_memory == 2
    assert 'id="heatmap"' in (tmp_path / "f.html").read_text()


def test_ray_reports_the_truncated_member_in_its_row(ray_session, fleet_dir: Path) -> None:
    res = run_fleet([fleet_dir], FleetOptions(engine=Engine.RAY, jobs=2))
    bad = res.table.filter(pl.col("error").is_not_null()).row(0, named=True)
    assert bad["path"].endswith("truncated.parquet") and "truncated" in bad["error"]
    assert res.summary.analyzed == 5
    assert res.summary.worst is not None and res.summary.worst.rank is None  # cupy-oom-frag: 243 MiB
    frag = next(g for g in res.summary.by_diagnosis if g.key == "fragmentation")
    assert frag.ranks == (1,) and frag.traces == 2


def test_an_address_where_no_cluster_answers_is_one_sentence(fleet_dir: Path) -> None:
    import socket

    from typer.testing import CliRunner

    from tracekit.cli.app import app

    with socket.socket() as s:  # a loopback port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["fleet", str(fleet_dir), "--engine", "ray", "--address", f"127.0.0.1:{port}"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1 and "no Ray cluster answers there" in res.stderr
