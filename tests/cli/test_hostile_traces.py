"""Round-1 leftovers: traces whose figures were impossible, and values that ended in a traceback.

An infinite number in the metadata (``1e999`` parses to infinity), a snapshot whose rounding
divisions hold text, a malloc whose ``rounded`` is below its ``size``, a block running past the
end of the address space, a ``t_ns`` spanning the whole int64 range, and a trace of many devices
in the report. Each is built here, tiny, with its worked answer.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import META_KEY

MiB = 1 << 20
SEG = 1 << 40


def pooled(tmp: Path, name: str = "t", **cols: Any) -> Path:
    """A 1 MiB segment, two blocks (1000 and 2048 bytes requested), both freed, the segment freed."""
    base: dict[str, Any] = {
        "op": np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE, Op.SEGMENT_FREE], np.int8),
        "size": np.array([MiB, 1000, 2048, 0, 0, 0], np.uint64),
        "addr": np.array([SEG, SEG, SEG + 1024, SEG, SEG + 1024, SEG], np.uint64),
        "rounded": np.array([0, 1024, 2048, 0, 0, 0], np.uint64),
    }
    base.update(cols)
    ev = Events.build(base.pop("op"), base.pop("size"), **base)
    return write_trace(tmp / f"{name}.parquet", TraceMeta.new(Source.CUPY), ev)


def cli(*args: object) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error(r: Any, *needles: str) -> None:
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert r.output.count("tracekit: error:") == 1, r.output
    for n in needles:
        assert n in r.output, r.output


@pytest.mark.parametrize("patch", [{"device": {"name": "x", "total_bytes": "INF", "free_bytes": 1}},
                                   {"pool_limit_bytes": "INF"}, {"device_total": "INF"},
                                   {"budget": {"device_total": "INF"}}])
def test_an_infinite_number_in_the_metadata_is_refused(tmp_path: Path, patch: dict[str, Any]) -> None:
    src = pooled(tmp_path)
    t = pq.read_table(src)
    meta = {**json.loads(t.schema.metadata[META_KEY]), **patch}
    raw = json.dumps(meta).replace('"INF"', "1e999")  # valid JSON syntax; the number overflows to inf
    pq.write_table(t.replace_schema_metadata({META_KEY: raw}), tmp_path / "inf.parquet")
    for verb in (["info"], ["analyze"], ["replay", "--sim", "cupy"]):
        one_error(cli(verb[0], tmp_path / "inf.parquet", *verb[1:]), "1e999 is not a finite number")


def test_rounding_divisions_that_are_not_numbers_leave_rounding_off(tmp_path: Path) -> None:
    def entry(action: str, size: int, t: int) -> dict[str, Any]:
        return {"action": action, "addr": 1 << 30, "size": size, "time_us": t, "frames": [], "stream": 0}

    for n, div in enumerate((["x"] * 16, {"1": "four", "2": [4], "many": 4}, [None] * 16, [-4] * 16)):
        snap = tmp_path / f"s{n}.pickle"
        history = [entry("segment_alloc", 20 * MiB, 0), entry("alloc", 5 * MiB + 1, 1)]
        settings = {"roundup_power2_divisions": div}
        snap.write_bytes(pickle.dumps({"segments": [], "allocator_settings": settings,
                                       "device_traces": [history]}))
        r = cli("import", "torch", snap, "-o", tmp_path / f"s{n}.parquet")
        assert r.exit_code == 0, r.output

        # No division applies: 5 MiB + 1 rounds up to a multiple of 512 bytes only (4 divisions: 6 MiB).
        assert int(read_trace(tmp_path / f"s{n}.parquet").events.rounded[1]) == 5 * MiB + 512


def test_rounded_below_size_counts_the_size(tmp_path: Path) -> None:
    # 10 MiB requested twice, rounded given as 1 byte: the allocator handed out at least 10 MiB each.
    path = pooled(tmp_path, size=np.array([64 * MiB, 10 * MiB, 10 * MiB, 0, 0, 0], np.uint64),
                  rounded=np.array([0, 1, 1, 0, 0, 0], np.uint64),
                  addr=np.array([SEG, SEG, SEG + 16 * MiB, SEG, SEG + 16 * MiB, SEG], np.uint64))
    r = cli("analyze", "--json", path)
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["peak_live_bytes"] == 20 * MiB == s["peak_requested_bytes"]
    assert s["warning_events"] == ["2 x malloc with rounded below size (first at seq 1)"]


def test_a_block_past_the_end_of_the_address_space_is_refused(tmp_path: Path) -> None:
    top = (1 << 64) - MiB  # a 1 MiB segment at the very top, a 1 TiB block "inside" it
    path = pooled(tmp_path, size=np.array([MiB, 1 << 40, 512, 0, 0, 0], np.uint64),
                  rounded=np.array([0, 1 << 40, 512, 0, 0, 0], np.uint64),
                  addr=np.array([top, top, top + 4096, top, top + 4096, top], np.uint64))
    for verb in ("info", "analyze"):
        one_error(cli(verb, path), "the block at seq 1 (1099511627776 bytes at 0xfffffffffff00000) runs past "
                  "the end of the 64-bit address space")
    ok = pooled(tmp_path, "edge", addr=np.array([top, top, top + 1024, top, top + 1024, top], np.uint64))
    assert cli("info", ok).exit_code == 0  # a segment ending exactly at 2^64 is fine


def test_a_time_span_of_the_whole_int64_range_is_refused(tmp_path: Path) -> None:
    path = pooled(tmp_path, t_ns=np.array([-(2**63), -5, 0, 5, 2**62, 2**63 - 1], np.int64))
    r = subprocess.run([sys.executable, "-m", "tracekit", "info", str(path)], capture_output=True, text=True)
    assert r.returncode == 1
    assert "t_ns spans 2^62 ns (146 years) or more" in r.stderr
    assert "RuntimeWarning" not in r.stderr and "overflow" not in r.stderr  # numpy's warning never shows


def test_a_report_of_many_devices_shows_eight(tmp_path: Path) -> None:
    from tracekit.analysis import analyze_trace
    from tracekit.report.build import build_figures
    from tracekit.report.sections import MAX_SHOWN_DEVICES, shown_devices

    n = 40  # device 17 runs out of memory; device 3 has the highest peak
    op = np.tile(np.array([Op.MALLOC, Op.FREE], np.int8), n)
    size = np.full(2 * n, 4096, np.uint64)
    size[6] = 1 << 30
    dev = np.repeat(np.arange(n, dtype=np.int16), 2)
    op[35] = Op.OOM
    addr = np.full(2 * n, MiB, np.uint64)
    addr[35] = 0
    path = write_trace(tmp_path / "d.parquet", TraceMeta.new(Source.SYNTHETIC),
                       Events.build(op, size, addr=addr, device=dev))
    trace = read_trace(path)
    result = analyze_trace(trace, timeline=True)
    shown = [p.device for p in shown_devices(result.summary)]
    assert len(shown) == MAX_SHOWN_DEVICES and 17 in shown and 3 in shown and result.summary.device in shown
    rendered, _, _ = build_figures(trace, result, "d.parquet")
    assert {int(r.key.rsplit("-device", 1)[1]) for r in rendered} == set(shown)
