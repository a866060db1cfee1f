"""Blocks against segments: tiny hand-built pooled traces with the exact warning, and real traces.

Segment S is 2 MiB at 0x7F0000000000 unless a test says otherwise; seq = row number.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from tracekit.analysis import analyze_trace
from tracekit.cli.app import app
from tracekit.errors import TraceFormatError
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

ROOT = Path(__file__).resolve().parents[2]
S, MiB = 0x7F0000000000, 1 << 20
SA, SF, M, F, OOM = Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.MALLOC, Op.FREE, Op.OOM


def _trace(tmp_path: Path, rows: list[tuple], expandable: list[bool] | None = None, name: str = "t") -> Path:
    """rows: (op, addr, size[, rounded[, device]]); rounded defaults to size for mallocs."""
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[2] for r in rows], np.uint64)
    rounded = np.array([r[3] if len(r) > 3 else (r[2] if r[0] in (M, OOM) else 0) for r in rows], np.uint64)
    dev = np.array([r[4] if len(r) > 4 else 0 for r in rows], np.int16)
    ev = Events.build(op, size, addr=np.array([r[1] for r in rows], np.uint64), rounded=rounded, device=dev)
    extras, fields = None, ()
    if expandable is not None:
        extras, fields = {"expandable": np.array(expandable)}, (pa.field("expandable", pa.bool_()),)
    return write_trace(tmp_path / f"{name}.parquet", TraceMeta.new(Source.SYNTHETIC), ev, extras, fields)


def _warnings(tmp_path: Path, rows: list[tuple], expandable: list[bool] | None = None) -> list[str]:
    t = read_trace(_trace(tmp_path, rows, expandable))
    assert len(t.events) == len(rows) and not t.issues  # warnings keep every event
    return [w.describe() for w in t.warnings]


OUTSIDE = "malloc outside any live segment of its device"


def test_a_consistent_pooled_trace_has_no_warnings(tmp_path: Path) -> None:
    rows = [(SA, S, 2 * MiB), (M, S + 512, 1000, 1024), (M, S + 2 * MiB - 512, 512), (F, S + 512, 0),
            (F, S + 2 * MiB - 512, 0), (SF, S, 0)]
    assert _warnings(tmp_path, rows) == []


@pytest.mark.parametrize("rows, seq", [
    ([(SA, S, 2 * MiB), (M, S + 4 * MiB, 512)], 1),  # beyond the segment
    ([(SA, S, 2 * MiB), (M, S + 2 * MiB - 512, 1024)], 1),  # runs past its end
    ([(M, S, 512), (SA, S, 2 * MiB)], 0),  # before its segment: a recording that started late
    ([(SA, S, 2 * MiB), (SF, S, 0), (M, S + 512, 512)], 2),  # after its segment was freed
    ([(SA, S, MiB), (SA, S + MiB, MiB), (M, S + MiB - 512, 1024)], 2),  # across two plain segments
])
def test_a_block_outside_its_live_segments_is_kept_with_a_warning(tmp_path: Path, rows: list,
                                                                  seq: int) -> None:
    assert _warnings(tmp_path, rows) == [f"1 x {OUTSIDE} (first at seq {seq})"]


def test_the_live_segment_is_found_behind_a_stale_one_at_a_nearer_address(tmp_path: Path) -> None:
    # A small segment at S + 1 MiB lives and dies first; later a large one at S covers its range.
    rows = [(SA, S + MiB, 4096), (SF, S + MiB, 0), (SA, S, 4 * MiB), (M, S + MiB + 8192, 512),
            (M, S + 3 * MiB, 512)]
    assert _warnings(tmp_path, rows) == []


def test_a_block_may_span_adjacent_live_expandable_cells_only(tmp_path: Path) -> None:
    cells = [(SA, S, 2 * MiB), (SA, S + 2 * MiB, 2 * MiB), (SA, S + 4 * MiB, 2 * MiB)]
    span = (M, S + MiB, 4 * MiB)  # first byte in cell 0, last in cell 2
    assert _warnings(tmp_path, [*cells, span], [True] * 4) == []
    assert _warnings(tmp_path, [*cells[:2], span], [True] * 3) == [f"1 x {OUTSIDE} (first at seq 2)"]
    last_plain = [True, True, False, False]
    assert _warnings(tmp_path, [*cells, span], last_plain) == [f"1 x {OUTSIDE} (first at seq 3)"]


def test_a_segment_freed_under_a_live_block(tmp_path: Path) -> None:
    rows = [(SA, S, 2 * MiB), (M, S + 512, 512), (M, S + 4096, 512), (F, S + 4096, 0), (SF, S, 0),
            (F, S + 512, 0), (SA, S + 8 * MiB, MiB), (M, S + 8 * MiB, 512), (SF, S + 8 * MiB, 0)]
    assert _warnings(tmp_path, rows) == ["2 x segment_free while blocks inside it are live (first at seq 4)"]


def test_rounded_below_size(tmp_path: Path) -> None:
    rows = [(SA, S, 2 * MiB), (M, S, 1000, 512), (M, S + 4096, 1000, 1024), (M, S + 8192, 4096, 4095)]
    assert _warnings(tmp_path, rows) == ["2 x malloc with rounded below size (first at seq 1)"]


def test_each_device_is_checked_against_its_own_segments(tmp_path: Path) -> None:
    rows = [(SA, S, 2 * MiB, 0, 0), (SA, S + 8 * MiB, 2 * MiB, 0, 1), (M, S, 512, 512, 0),
            (M, S + 8 * MiB, 512, 512, 1), (M, S + 16 * MiB, 512, 512, 1), (M, S + 32 * MiB, 512, 512, 2)]
    # Device 2 has no segment rows: a raw-device part, not checked.
    assert _warnings(tmp_path, rows) == [f"1 x {OUTSIDE} (first at seq 4)"]


def test_a_pool_without_segment_rows_is_not_checked_on_a_shared_device(tmp_path: Path) -> None:
    # Pool 0 has segments; pool 2 (CuPy's stream-ordered pool) has none, on the same device.
    rows = [(SA, S, 2 * MiB), (M, S, 512), (M, 1 << 40, 512), (M, S + 4 * MiB, 512)]
    ev = Events.build(np.array([r[0] for r in rows], np.int8), np.array([r[2] for r in rows], np.uint64),
                      addr=np.array([r[1] for r in rows], np.uint64))
    path = write_trace(tmp_path / "p.parquet", TraceMeta.new(Source.SYNTHETIC), ev,
                       {"pool": np.array([0, 0, 2, 0], np.int64)}, (pa.field("pool", pa.int64()),))
    assert [w.describe() for w in read_trace(path).warnings] == [f"1 x {OUTSIDE} (first at seq 3)"]


def test_a_raw_device_trace_is_not_checked_for_segments(tmp_path: Path) -> None:
    assert _warnings(tmp_path, [(M, S, 512), (M, 1 << 40, 512), (F, S, 0)]) == []


def test_strict_makes_a_warning_an_error(tmp_path: Path) -> None:
    path = _trace(tmp_path, [(SA, S, 2 * MiB), (M, S + 4 * MiB, 512)])
    with pytest.raises(TraceFormatError, match=rf"inconsistent events \(--strict\): 1 x {OUTSIDE} "):
        read_trace(path, strict=True)


def test_info_prints_the_warning_and_strict_exits_1(tmp_path: Path) -> None:
    path = _trace(tmp_path, [(SA, S, 2 * MiB), (M, S + 4 * MiB, 512), (M, S, 1000, 512)])
    r = CliRunner().invoke(app, ["info", str(path)])
    assert r.exit_code == 0
    assert f"warning      kept 1 x {OUTSIDE} (first at seq 1)" in r.stdout
    assert "warning      kept 1 x malloc with rounded below size (first at seq 2)" in r.stdout
    r = CliRunner().invoke(app, ["info", "--json", str(path)])
    assert json.loads(r.stdout)["warning_events"][0] == f"1 x {OUTSIDE} (first at seq 1)"
    p = subprocess.run([sys.executable, "-m", "tracekit", "info", "--strict", str(path)], capture_output=True,
                       text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert f"inconsistent events (--strict): 1 x {OUTSIDE} (first at seq 1)" in p.stderr


def test_analyze_carries_the_warnings_and_refuses_a_negative_free(tmp_path: Path) -> None:
    # 1 MiB reserved, 3 MiB of blocks outside it: free in the pool would be -2 MiB at the OOM.
    rows = [(SA, S, MiB), (M, S + 4 * MiB, 3 * MiB), (OOM, 0, 8 * MiB)]
    s = analyze_trace(read_trace(_trace(tmp_path, rows))).summary
    assert s.warnings == (f"1 x {OUTSIDE} (first at seq 1)",)
    d = s.to_dict()
    assert d["warning_events"] == list(s.warnings) and d["skipped_events"] == []
    assert d["oom"]["free_in_pool"] is None
    text = s.to_text()
    assert f"kept inconsistent events (figures may be off): 1 x {OUTSIDE} (first at seq 1)" in text
    assert "unknown (live exceeds reserved" in text and "-2.00 MiB" not in text
    assert "this diagnosis is unreliable" in s.oom.explanation  # type: ignore[union-attr]


def test_every_committed_trace_reads_without_warnings() -> None:
    paths = sorted((ROOT / "traces").rglob("*.parquet"))
    assert len(paths) > 20
    for p in paths:
        t = read_trace(p, extras=False)
        assert not t.warnings, f"{p.name}: {[w.describe() for w in t.warnings]}"


@pytest.mark.parametrize("seed", range(6))
def test_the_bucket_table_counts_starts_as_a_binary_search_does(seed: int) -> None:
    from tracekit.trace.containment import _Segments

    rng = np.random.default_rng(seed)
    spread = [1 << 20, 1 << 40, 1 << 63][seed % 3]
    lo = np.sort(rng.integers(0, spread, 50, dtype=np.uint64))
    rows = np.arange(len(lo), dtype=np.int64)
    segs = _Segments.build(rows, np.zeros(len(lo), np.int32), lo, np.full(len(lo), 4096, np.uint64),
                           np.full(len(lo), -1, np.int64), None, len(lo) + 1)
    a = np.concatenate([rng.integers(0, spread + (1 << 16), 5000, dtype=np.uint64), lo, lo - np.uint64(1),
                        np.array([0, (1 << 64) - 1], np.uint64)])
    assert np.array_equal(segs._starts_upto(a), np.searchsorted(segs.starts, a, side="right"))
