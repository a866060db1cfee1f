"""Reports: figure data checked as data on hand-made traces whose answers are worked out here.

The hand trace: one 64 MiB segment at ``BASE`` filled by eight 8 MiB blocks
(mallocs at seq 1..8, t = 0.25 s apart), the even ones freed (seq 9..12),
then a 16 MiB request fails (seq 13). At the OOM the segment holds live
blocks at offsets 8, 24, 40, 56 MiB and four 8 MiB gaps (offsets 0, 16, 32,
48 MiB): 32 MiB free, largest gap 8 MiB, so a 16 MiB request cannot fit.
``hand_analysis`` is a slow per-event reference used as the analyzer's
output so these tests check the drawing, not the analysis.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.report.timeline import Marks
from tracekit.trace import DeviceInfo, Events, Op, Source, Trace, TraceMeta, read_trace, write_trace

MiB = 1 << 20
BASE = 0x7F00_0000_0000
SITES = ("model/a.py:10:weights", "model/b.py:20:activations", "model/c.py:30:temporary")


def hand_trace(path: Path, *, oom: bool = True) -> Path:
    """The trace of the module docstring (14 events; 13 without the OOM row)."""
    rows: list[tuple[int, int, int, int, int]] = [(Op.SEGMENT_ALLOC, BASE, 64 * MiB, 0, -1)]
    rows += [(Op.MALLOC, BASE + i * 8 * MiB, 8 * MiB - 100, 8 * MiB, i % 3) for i in range(8)]
    rows += [(Op.FREE, BASE + i * 8 * MiB, 8 * MiB, 0, -1) for i in range(0, 8, 2)]
    if oom:
        rows.append((Op.OOM, 0, 16 * MiB, 16 * MiB, 2))
    op, addr, size, rounded, site = (np.array(c) for c in zip(*rows, strict=True))
    ev = Events.build(
        op=op,
        size=size,
        addr=addr,
        rounded=rounded,
        site=site,
        t_ns=np.arange(len(op)) * 250_000_000,
        sites=SITES,
    )
    meta = TraceMeta.new(Source.SYNTHETIC, device=DeviceInfo("Test GPU", 80 * MiB, 70 * MiB))
    write_trace(path, meta, ev)
    return path


@dataclass
class HandSummary:
    d: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.d

    def to_text(self) -> str:
        return str(self.d)

    def marks(self) -> Marks:
        """The timeline's marks, from this hand-made summary's OOM."""
        oom = self.d["oom"]
        return Marks(oom_seq=oom["seq"], oom_text=oom["explanation"], oom_reserved=oom["reserved_bytes"],
                     oom_request=oom["rounded"] or oom["size"])


@dataclass
class HandAnalysis:
    timeline: pa.Table
    summary: HandSummary


def hand_analysis(trace: Trace) -> HandAnalysis:
    """Per-event reference, O(n^2): live/reserved/largest gap by brute force (tiny traces only)."""
    ev = trace.events
    live: dict[int, tuple[int, int, int]] = {}
    segs: dict[int, int] = {}
    names = (
        "live_bytes",
        "requested_bytes",
        "reserved_bytes",
        "free_in_pool",
        "largest_free_block",
        "external_fragmentation",
        "device_free",
    )
    cols: dict[str, list[Any]] = {k: [] for k in names}
    start_free = trace.meta.device.free_bytes if trace.meta.device else None
    oom = None
    for i in range(len(ev)):
        o, a = ev.op[i], int(ev.addr[i])
        if o == Op.MALLOC:
            live[a] = (int(ev.rounded[i]), int(ev.size[i]), int(ev.site[i]))
        elif o == Op.FREE:
            live.pop(a, None)
        elif o == Op.SEGMENT_ALLOC:
            segs[a] = int(ev.size[i])
        elif o == Op.SEGMENT_FREE:
            segs.pop(a, None)
        lb = sum(v[0] for v in live.values())
        rs = sum(segs.values())
        best = 0
        for s, sz in segs.items():
            cur = s
            for b in sorted(x for x in live if s <= x < s + sz):
                best, cur = max(best, b - cur), b + live[b][0]
            best = max(best, s + sz - cur)
        vals = [
            lb,
            sum(v[1] for v in live.values()),
            rs,
            rs - lb,
            best,
            0.0 if rs - lb <= 0 else 1 - best / (rs - lb),
            None if start_free is None else start_free - rs,
        ]
        for k, v in zip(names, vals, strict=True):
            cols[k].append(v)
        if o == Op.OOM and oom is None:
            oom = {
                "seq": int(ev.seq[i]),
                "t_ns": int(ev.t_ns[i]),
                "size": int(ev.size[i]),
                "rounded": int(ev.rounded[i]),
                "site": ev.site_name(i),
                "live_bytes": lb,
                "reserved_bytes": rs,
                "free_in_pool": rs - lb,
                "largest_free_block": best,
                "device_free": vals[-1],
                "diagnosis": "fragmentation",
                "explanation": f"hand-made explanation of the OOM at seq {int(ev.seq[i])}",
                "top_live_sites": [{"site": SITES[1], "bytes": 16 * MiB, "blocks": 2}],
            }
    tbl = pa.table(
        {
            "seq": pa.array(ev.seq),
            "t_ns": pa.array(ev.t_ns),
            **{
                k: pa.array(v, pa.float64() if k == "external_fragmentation" else pa.int64())
                for k, v in cols.items()
            },
        }
    )
    lbs, rss = np.array(cols["live_bytes"]), np.array(cols["reserved_bytes"])
    summary = {
        "events": len(ev),
        "duration_s": float(ev.t_ns[-1] - ev.t_ns[0]) / 1e9,
        "peak_live_bytes": int(lbs.max()),
        "peak_live_seq": int(ev.seq[lbs.argmax()]),
        "peak_requested_bytes": max(cols["requested_bytes"]),
        "peak_reserved_bytes": int(rss.max()),
        "peak_reserved_seq": int(ev.seq[rss.argmax()]),
        "max_external_fragmentation": max(cols["external_fragmentation"]),
        "min_largest_free_block": 0,
        "jw1": None,
        "jw2": None,
        "jw3": None,
        "jw4": None,
        "oom": oom,
        "leaks": [{"site": SITES[1], "bytes": 16 * MiB, "blocks": 2}],
    }
    return HandAnalysis(tbl, HandSummary(summary))


@pytest.fixture
def hand(tmp_path: Path) -> tuple[Path, Trace, HandAnalysis]:
    p = hand_trace(tmp_path / "hand.parquet")
    tr = read_trace(p)
    return p, tr, hand_analysis(tr)


# --- envelope ---------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10**12), min_size=1, max_size=3000), st.integers(1, 300), st.booleans())
def test_envelope_keeps_every_peak(values: list[int], npix: int, uneven: bool) -> None:
    from tracekit.report.envelope import column_starts, envelope

    y = np.array(values, dtype=np.float64)
    x = np.cumsum(np.arange(len(y)) % 7 == 0) if uneven else np.arange(len(y), dtype=np.float64)
    env = envelope(x, y, npix)
    if env.exact:
        assert np.array_equal(env.hi, y) and np.array_equal(env.lo, y)
        return
    starts = column_starts(np.asarray(x, np.float64), npix)
    col = np.searchsorted(starts, np.arange(len(y)), side="right") - 1
    assert np.all(env.lo[col] <= y) and np.all(y <= env.hi[col])  # every point inside its column
    assert env.hi.max() == y.max() and env.lo.min() == y.min()  # the extremes at their exact height
    assert set(env.hi.tolist()) <= set(y.tolist())  # only attained values, nothing invented
    assert len(env.x) <= npix


def test_envelope_single_spike_survives_a_million_points() -> None:
    from tracekit.report.envelope import envelope

    y = np.zeros(1_000_000)
    y[123_457] = 5.0  # one event wide: decimation would lose it
    env = envelope(np.arange(len(y), dtype=np.float64), y, 800)
    assert env.hi.max() == 5.0 and np.count_nonzero(env.hi) == 1 + (env.x > 123_457).argmax() * 0


# --- timeline ----------------------------------------------------------------------------------------


def test_timeline_oom_marker_sits_at_the_oom_seq(hand: tuple[Path, Trace, HandAnalysis]) -> None:
    from tracekit.report.figures import draw_timeline
    from tracekit.report.timeline import timeline_data

    _, _, an = hand
    d = timeline_data(an.timeline, an.summary.marks())
    assert d.axis.label.endswith("(s)")  # 3.25 s trace: seconds
    assert d.oom_seq == 13 and d.oom_x == pytest.approx(13 * 0.25)
    assert d.scale.unit == "MiB"
    assert d.series["live"].hi.max() == 64 * MiB  # all eight blocks live after seq 8
    assert d.frag is not None and d.frag.hi[-1] == pytest.approx(75.0)  # 1 - 8 MiB / 32 MiB
    fig = draw_timeline(d, "hand")
    markers = [a for ax in fig.axes for a in ax.get_lines() if a.get_gid() == "oom-marker"]
    assert len(markers) == 1 and list(markers[0].get_xdata()) == [13 * 0.25, 13 * 0.25]


def test_timeline_uses_event_index_when_times_are_only_the_seq() -> None:
    from tracekit.report.timeline import Marks, timeline_data

    n = 10
    tbl = pa.table(
        {
            "seq": pa.array(np.arange(n), pa.uint64()),
            "t_ns": pa.array(np.arange(n), pa.int64()),
            "live_bytes": np.arange(n) * MiB,
            "reserved_bytes": np.arange(n) * MiB,
        }
    )
    d = timeline_data(tbl, Marks(raw_device=True, oom_seq=7, oom_text="x"))
    assert d.axis.by_index and d.oom_x == 7.0
    assert d.frag is None  # no pool: fragmentation is not drawn as a flat zero
    assert d.reserved_is_live and "reserved" not in d.series  # raw-device trace: one curve


# --- memory map and the OOM moment ---------------------------------------------------------------------


def test_memory_map_places_each_block_exactly(hand: tuple[Path, Trace, HandAnalysis]) -> None:
    from tracekit.report import blocks as blk
    from tracekit.report.memory_map import draw_memory_map, map_data
    from tracekit.report.style import site_colours, time_axis

    _, tr, _ = hand
    ev = tr.events
    b = blk.blocks(tr)
    layout, by_seg = blk.layout_for(b, blk.segments(tr))
    assert by_seg and layout.total == 64 * MiB
    axis = time_axis(ev.t_ns, ev.seq)
    x = np.append(axis.x(ev.t_ns, np.arange(len(ev))), 3.5)
    md = map_data(b, layout, x, axis, site_colours(3, np.arange(3)), [])
    assert md.n_exact == 8 and md.n_aggregated == 0 and md.image is None
    rects = md.rects[np.argsort(md.rects[:, 2])]
    for i, (x0, x1, y0, y1) in enumerate(rects):
        assert (y0, y1) == (i * 8 * MiB, (i + 1) * 8 * MiB)
        assert x0 == pytest.approx((1 + i) * 0.25)  # malloc i is event 1 + i
        # even blocks are freed at events 9, 10, 11, 12; odd ones live to the end (x = 3.5)
        assert x1 == pytest.approx((9 + i // 2) * 0.25 if i % 2 == 0 else 3.5)
    draw_memory_map(md, "hand", 3.25)


def test_memory_map_aggregates_small_blocks_without_losing_bytes() -> None:
    from tracekit.report.blocks import Spans, address_layout
    from tracekit.report.memory_map import map_data
    from tracekit.report.style import TimeAxis, site_colours

    n = 200  # 200 blocks of 1 KiB side by side, each alive for the whole run: a full 200 KiB band
    b = Spans(
        np.zeros(n, np.int64),
        np.ones(n, np.int64),
        (np.arange(n) * 1024).astype(np.uint64),
        np.full(n, 1024, np.uint64),
        np.zeros(n, np.int32),
    )
    layout = address_layout(b, merge_touching=True)
    assert len(address_layout(b).lo) == n
    assert len(layout.lo) == 1 and layout.total == n * 1024  # adjacent blocks merge into one range
    axis = TimeAxis("t", False, 0, 1.0)
    md = map_data(
        b, layout, np.array([0.0, 1.0]), axis, site_colours(1, np.zeros(1)), [], exact=0, width=50, height=20
    )
    assert md.n_exact == 0 and md.n_aggregated == n and md.image is not None
    assert np.allclose(md.image[..., 3], 0.95)  # ten 1 KiB blocks fill each 10 KiB row: fully covered
    half = Spans(b.start[:100], b.end[:100], b.addr[:100] * 2, b.size[:100], b.site[:100])  # every other KiB
    md = map_data(
        half,
        layout,
        np.array([0.0, 1.0]),
        axis,
        site_colours(1, np.zeros(1)),
        [],
        exact=0,
        width=50,
        height=20,
    )
    assert md.image is not None and np.allclose(md.image[..., 3], 0.95 * 0.5)  # half of each cell's bytes


def test_memory_map_keeps_the_largest_blocks_exact() -> None:
    from tracekit.report.blocks import Spans, address_layout
    from tracekit.report.memory_map import map_data
    from tracekit.report.style import TimeAxis, site_colours

    sizes = np.array([5, 1, 9, 2, 7, 3], np.uint64) * 1024
    addr = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.uint64)
    b = Spans(np.zeros(6, np.int64), np.ones(6, np.int64), addr, sizes, np.zeros(6, np.int32))
    md = map_data(
        b,
        address_layout(b),
        np.array([0.0, 1.0]),
        TimeAxis("t", False, 0, 1.0),
        site_colours(1, np.zeros(1)),
        [],
        exact=3,
    )
    assert sorted((md.rects[:, 3] - md.rects[:, 2]).tolist()) == [5 * 1024, 7 * 1024, 9 * 1024]
    assert md.n_aggregated == 3


def test_address_layout_squeezes_out_the_gaps_between_segments() -> None:
    from tracekit.report.blocks import Spans, address_layout

    addr = np.array([BASE + 10 * MiB, BASE, BASE + 10 * MiB], np.uint64)  # one segment re-taken
    s = Spans(
        np.array([0, 1, 5]),
        np.array([4, 9, 9]),
        addr,
        np.array([4 * MiB, 2 * MiB, 4 * MiB], np.uint64),
        np.full(3, -1, np.int32),
    )
    lay = address_layout(s)
    assert lay.total == 6 * MiB
    assert list(lay.offset(np.array([BASE, BASE + MiB, BASE + 10 * MiB, BASE + 13 * MiB], np.uint64))) == [
        0,
        MiB,
        2 * MiB,
        5 * MiB,
    ]


def test_oom_moment_shows_the_gaps_and_the_request(hand: tuple[Path, Trace, HandAnalysis]) -> None:
    from tracekit.analysis import pool_state_at
    from tracekit.report.oom_view import draw_moment, moment
    from tracekit.report.style import site_colours

    _, tr, _ = hand
    state = pool_state_at(tr.events, tr.mate, 14)  # right after the OOM row (index 13)
    m = moment(state, 13, 13, 16 * MiB, True, site_colours(3, np.arange(3)))
    assert len(m.rows) == 1 and m.rows[0].size == 64 * MiB
    assert list(m.rows[0].block_off) == [8 * MiB, 24 * MiB, 40 * MiB, 56 * MiB]
    assert list(m.rows[0].gap_off) == [0, 16 * MiB, 32 * MiB, 48 * MiB]
    assert list(m.rows[0].gap_size) == [8 * MiB] * 4
    assert (m.largest_gap, m.largest_off, m.request) == (8 * MiB, 0, 16 * MiB)
    fig = draw_moment(m, [])
    req = [p for p in fig.axes[0].patches if p.get_gid() == "request"]
    gap = [p for p in fig.axes[0].patches if p.get_gid() == "largest-gap"]
    assert req[0].get_width() == pytest.approx(16.0) and gap[0].get_width() == pytest.approx(8.0)  # MiB


# --- the whole report: the page, and the figures beside it -------------------------------------------


def page_model(path: Path) -> dict[str, Any]:
    """The JSON model embedded in a written page."""
    import json
    import re

    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', path.read_text(), re.S)
    assert m is not None
    return dict(json.loads(m.group(1)))


def test_write_report_is_the_page_and_the_figures_beside_it(
    hand: tuple[Path, Trace, HandAnalysis], tmp_path: Path
) -> None:
    """``tracekit.report.write_report`` is the page (one report); ``png_dir`` gets the matplotlib figures."""
    from tracekit.report import write_report

    p, _, _ = hand
    out = write_report(p, tmp_path / "r.html", png_dir=tmp_path / "png")
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>") and "default-src 'none'" in text  # nothing to fetch
    m = page_model(out)
    assert m["verdict"]["diagnosis"] == "fragmentation" and "16.00 MiB requested" in m["verdict"]["text"]
    assert sorted(f.name for f in (tmp_path / "png").iterdir()) == [
        "memory-map.png",
        "oom-moment.png",
        "sites.png",
        "sizes.png",
        "timeline.png",
    ]
    assert all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in (tmp_path / "png").iterdir())


def test_write_report_refuses_to_overwrite_its_input(hand: tuple[Path, Trace, HandAnalysis]) -> None:
    from tracekit.errors import OutputError
    from tracekit.report import write_report

    p, _, _ = hand
    before = p.read_bytes()
    with pytest.raises(OutputError, match="refusing to overwrite"):
        write_report(p, p)
    assert p.read_bytes() == before


def test_whatif_table_from_a_dict(hand: tuple[Path, Trace, HandAnalysis], tmp_path: Path) -> None:
    """Saved what-if JSON (here with the older ``capacity_bytes`` name too) reads as a ``WhatIfResult``."""
    from tracekit.advise.capacity import WhatIfResult
    from tracekit.report import write_report

    p, _, _ = hand
    wi = {
        "lower_bound_bytes": 64 * MiB,
        "policies": [
            {"policy": "best-fit", "min_capacity_bytes": 80 * MiB, "overhead_ratio": 0.25},
            {"policy": "first-fit", "capacity_bytes": 72 * MiB},
            {
                "policy": "torch",
                "min_capacity_bytes": None,
                "overhead_ratio": None,
                "searched_up_to_bytes": 1 << 40,
                "error": None,
            },
        ],
    }
    out = write_report(p, tmp_path / "w.html", whatif=WhatIfResult.from_dict(wi), png_dir=tmp_path / "png")
    (table,) = [t for t in page_model(out)["tables"] if t["title"].startswith("What-if")]
    assert table["rows"] == [["best-fit", 80 * MiB, 0.25, ""], ["first-fit", 72 * MiB, 0.125, ""],
                             ["torch", None, None, "no fit up to 1.00 TiB"]]
    assert (tmp_path / "png" / "whatif.png").is_file()


def test_whatif_result_from_the_search(hand: tuple[Path, Trace, HandAnalysis], tmp_path: Path) -> None:
    from tracekit.advise.capacity import WhatIfResult, whatif
    from tracekit.report import write_report
    from tracekit.report.sections import whatif_rows

    p, tr, _ = hand
    res = whatif(tr, ["best-fit", "first-fit"], jobs=1)
    rows = whatif_rows(res)
    assert [r.policy for r in rows] == ["best-fit", "first-fit"]
    assert all(r.capacity_bytes == f.min_capacity for r, f in zip(rows, res.fits, strict=True))
    assert WhatIfResult.from_dict(res.to_dict()) == res  # saved JSON reads back as the same result
    out = write_report(p, tmp_path / "w.html", whatif=res)
    (table,) = [t for t in page_model(out)["tables"] if t["title"].startswith("What-if")]
    assert [r[:2] for r in table["rows"]] == [[f.policy, f.min_capacity] for f in res.fits]


def test_cli_report_bad_input_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-trace.parquet"
    bad.write_text("hello")
    r = subprocess.run(
        [sys.executable, "-m", "tracekit", "report", str(bad), "-o", str(tmp_path / "o.html")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.returncode == 1
    assert r.stderr.startswith("tracekit: error: ") and "Traceback" not in r.stderr
    assert str(bad) in r.stderr and not (tmp_path / "o.html").exists()


def test_cli_report_help_lists_the_options() -> None:
    from tracekit.cli.app import app

    r = CliRunner().invoke(app, ["report", "--help"])
    assert r.exit_code == 0
    for opt in ("--output", "--png", "--baseline", "--whatif"):
        assert opt in r.output


def test_matplotlib_is_not_imported_by_the_cli_or_the_package() -> None:
    code = (
        "import sys, tracekit.cli.app, tracekit.report; "
        "print(any(m == 'matplotlib' or m.startswith('matplotlib.') for m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert r.stdout.strip() == "False", r.stderr


def test_cli_report_with_the_analyzer_and_a_baseline(tmp_path: Path) -> None:
    import html as html_mod

    from tracekit.analysis import analyze_trace
    from tracekit.cli.app import app

    p = hand_trace(tmp_path / "hand.parquet")
    base = hand_trace(tmp_path / "fixed.parquet", oom=False)
    out, png = tmp_path / "r.html", tmp_path / "png"
    r = CliRunner().invoke(
        app, ["report", str(p), "-o", str(out), "--png", str(png), "--baseline", str(base)]
    )
    assert r.exit_code == 0, r.output
    assert f"Wrote {out}" in r.output
    text = out.read_text()
    oom = analyze_trace(read_trace(p)).summary.to_dict()["oom"]
    assert html_mod.escape(oom["explanation"]) in text  # the analyzer's sentence, verbatim
    assert '"baseline":{"name":"fixed.parquet"' in text  # the interactive page's data model
    assert len(list(png.glob("*.png"))) == 6 and (png / "baseline.png").is_file()


def test_cli_report_default_output_sits_beside_the_trace(tmp_path: Path) -> None:
    from tracekit.cli.app import app

    p = hand_trace(tmp_path / "hand.parquet")
    r = CliRunner().invoke(app, ["report", str(p)])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "hand.html").is_file()


def test_cli_report_with_saved_whatif_json(tmp_path: Path) -> None:
    import json

    from tracekit.cli.app import app

    p = hand_trace(tmp_path / "hand.parquet")
    wi = tmp_path / "whatif.json"
    wi.write_text(
        json.dumps(
            {
                "lower_bound_bytes": 64 * MiB,
                "policies": [{"policy": "best-fit", "capacity_bytes": 66 * MiB, "overhead": 66 / 64 - 1}],
            }
        )
    )
    out = tmp_path / "w.html"
    r = CliRunner().invoke(
        app, ["report", str(p), "-o", str(out), "--whatif-json", str(wi), "--png", str(tmp_path)]
    )
    assert r.exit_code == 0, r.output
    assert "best-fit" in out.read_text() and (tmp_path / "whatif.png").is_file()
    r = CliRunner().invoke(app, ["report", str(p), "--whatif", "--whatif-json", str(wi)])
    assert r.exit_code == 2 and "exclusive" in r.output


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(1, 5), st.booleans()), min_size=1, max_size=30))
def test_oom_moment_blocks_and_gaps_tile_each_segment(layout: list[tuple[int, int, bool]]) -> None:
    """Blocks placed left to right in 64 KiB segments (gap, size, live?) in units of 1 KiB."""
    from tracekit.analysis.leaks import PoolState
    from tracekit.report.oom_view import moment
    from tracekit.report.style import site_colours

    seg_size, kib = 64 * 1024, 1024
    addrs, sizes, alive, cur, seg_lo = [], [], [], 0, [0]
    for gap, size, live in layout:
        if cur + (gap + size) * kib > seg_lo[-1] + seg_size:  # start the next segment
            seg_lo.append(seg_lo[-1] + seg_size)
            cur = seg_lo[-1]
        cur += gap * kib
        addrs.append(BASE + cur)
        sizes.append(size * kib)
        alive.append(live)
        cur += size * kib
    k = len(addrs) + 1  # the moment is after every malloc; dead blocks were freed before it
    live = np.array(alive, bool)
    u64 = lambda xs: np.array(xs, np.uint64)  # noqa: E731
    m_seg = len(seg_lo)
    state = PoolState(
        block_addr=u64(addrs)[live], block_size=u64(sizes)[live], block_requested=u64(sizes)[live],
        block_stream=np.zeros(int(live.sum()), np.uint64), block_site=np.zeros(int(live.sum()), np.int32),
        block_index=np.flatnonzero(live), seg_addr=(BASE + np.array(seg_lo)).astype(np.uint64),
        seg_size=np.full(m_seg, seg_size, np.uint64), seg_stream=np.zeros(m_seg, np.uint64), sites=(),
    )
    m = moment(state, k, k, 8 * kib, True, site_colours(1, np.zeros(1)), max_rows=100)
    assert len(m.rows) == m_seg
    best = 0
    for row in m.rows:
        assert int(row.block_size.sum() + row.gap_size.sum()) == seg_size  # blocks and gaps tile it
        spans = sorted(
            [(int(o), int(s)) for o, s in zip(row.block_off, row.block_size, strict=True)]
            + [(int(o), int(s)) for o, s in zip(row.gap_off, row.gap_size, strict=True)]
        )
        assert all(a + s == c for (a, s), (c, _) in itertools.pairwise(spans))  # no overlap, no hole
        best = max(best, int(row.gap_size.max()) if len(row.gap_size) else 0)
    assert m.largest_gap == best


def test_envelope_holds_the_last_value_across_empty_columns() -> None:
    """A burst then a long quiet stretch: after the burst the curve holds its last value, not its range."""
    from tracekit.report.envelope import envelope

    x = np.concatenate([np.linspace(0, 0.001, 5000), [1.0]])
    y = np.concatenate([np.tile([0.0, 9.0], 2500)[:-1], [4.0], [4.0]])  # the burst ends at 4
    env = envelope(x, y, 100)
    xs, lo, hi = env.steps()
    assert env.hi[0] == 9.0 and env.lo[0] == 0.0  # the burst's range, in its column
    assert env.last is not None and env.last[0] == 4.0
    assert len(xs) == 4 and xs[2] == 1.0  # nothing else is drawn until the next event at x = 1
    assert lo[1] == hi[1] == 4.0 and xs[1] == pytest.approx(0.01)  # the first column ends at 1/100


def test_analyze_verb_writes_the_same_report(tmp_path: Path) -> None:
    """``analyze --report`` writes the page ``tracekit report`` writes, byte for byte."""
    from tracekit.cli.app import app

    p = hand_trace(tmp_path / "hand.parquet")
    out, page = tmp_path / "from-analyze.html", tmp_path / "from-report.html"
    r = CliRunner().invoke(app, ["analyze", str(p), "--report", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["report", str(p), "-o", str(page)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == page.read_bytes() and "data:image/png" not in out.read_text()


def test_analyze_report_reads_and_analyzes_the_trace_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracekit.analysis
    import tracekit.analysis.output as output
    from tracekit.cli.app import app

    p = hand_trace(tmp_path / "hand.parquet")
    reads: list[object] = []
    analyses: list[object] = []
    real_read, real_analyze = output.read_trace, tracekit.analysis.analyze_trace
    monkeypatch.setattr(output, "read_trace", lambda *a, **k: reads.append(a) or real_read(*a, **k))
    counted = lambda *a, **k: analyses.append(a) or real_analyze(*a, **k)  # noqa: E731
    # analyze's own call, bound in output at import or imported from the analyzer where it is used
    monkeypatch.setattr(output, "analyze_trace", counted, raising=False)
    monkeypatch.setattr("tracekit.analysis.analyze.analyze_trace", counted)
    monkeypatch.setattr("tracekit.report.page.read_trace", lambda *a, **k: pytest.fail("read again"))
    monkeypatch.setattr(tracekit.analysis, "analyze_trace", lambda *a, **k: pytest.fail("analysed again"))
    r = CliRunner().invoke(app, ["analyze", str(p), "--report", str(tmp_path / "r.html")])
    assert r.exit_code == 0, r.output
    assert len(reads) == 1 and len(analyses) == 1


def test_a_missing_baseline_fails_before_any_work(tmp_path: Path) -> None:
    from tracekit.errors import InputError
    from tracekit.report import write_report

    p = hand_trace(tmp_path / "hand.parquet")
    with pytest.raises(InputError, match="no such file"):
        write_report(p, tmp_path / "r.html", baseline=tmp_path / "missing.parquet")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "found a list"),
        ('{"policies": {"policy": "cupy"}}', "'policies' must be a list"),
        ('{"policies": [{"policy": "cupy", "min_capacity_bytes": "6GiB"}]}', "or null, found"),
    ],
)
def test_bad_whatif_json_is_refused_before_any_figure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, cause: str
) -> None:
    import tracekit.report.page as page
    from tracekit.cli.app import app
    from tracekit.errors import InputError

    p = hand_trace(tmp_path / "hand.parquet")
    wi = tmp_path / "whatif.json"
    wi.write_text(text)
    out = tmp_path / "w.html"
    read: list[int] = []
    monkeypatch.setattr(page, "read_trace", lambda *a, **k: read.append(1))
    with pytest.raises(InputError, match=cause) as e:
        page.write_page(p, out, whatif=wi)
    assert str(wi) in str(e.value) and not read and not out.exists()
    monkeypatch.undo()
    r = CliRunner().invoke(app, ["report", str(p), "-o", str(out), "--whatif-json", str(wi)])
    assert r.exit_code == 1 and cause in r.stderr and "Traceback" not in r.output and not out.exists()


def test_report_advise_limit_and_the_note_when_advise_cannot_run(tmp_path):
    from typer.testing import CliRunner

    from tracekit.cli.app import app

    raw = tmp_path / "raw.parquet"
    made = CliRunner().invoke(app, ["synth", "--pattern", "random", "--events", "2000", "-o", str(raw)])
    assert made.exit_code == 0
    r = CliRunner().invoke(app, ["report", str(raw), "-o", str(tmp_path / "a.html"), "--advise"])
    assert r.exit_code == 0 and "advise did not run" in r.output and "--limit SIZE" in r.output
    r = CliRunner().invoke(app, ["report", str(raw), "-o", str(tmp_path / "b.html"), "--advise",
                                 "--limit", "64MiB"])
    assert r.exit_code == 0 and "advise did not run" not in r.output
    assert "What to change" in (tmp_path / "b.html").read_text()
    r = CliRunner().invoke(app, ["report", str(raw), "-o", str(tmp_path / "c.html"), "--limit", "64MiB"])
    assert r.exit_code == 2 and "--advise" in r.output


def _traces() -> Path:
    return Path(__file__).resolve().parents[2] / "traces"


def test_saved_whatif_of_another_trace_is_refused(tmp_path: Path) -> None:
    from tracekit.cli.app import app

    saved = tmp_path / "w.json"
    r = CliRunner().invoke(app, ["whatif", str(_traces() / "torch-oom.parquet"), "--json",
                                 "--policies", "best-fit"])
    assert r.exit_code == 0, r.output
    saved.write_text(r.stdout)
    page = tmp_path / "p.html"
    frag = str(_traces() / "cupy-oom-frag.parquet")
    r = CliRunner().invoke(app, ["report", frag, "--whatif-json", str(saved), "-o", str(page)])
    assert r.exit_code == 1 and "holds the what-if of" in r.output and not page.exists()
    (tmp_path / "e.json").write_text("{}")
    r = CliRunner().invoke(app, ["report", str(_traces() / "cupy-oom-frag.parquet"), "--whatif-json",
                                 str(tmp_path / "e.json"), "-o", str(page)])
    assert r.exit_code == 1 and "holds no what-if result" in r.output and not page.exists()


def test_the_page_and_a_figure_at_one_path_are_refused(tmp_path: Path) -> None:
    from tracekit.cli.app import app

    r = CliRunner().invoke(app, ["report", str(_traces() / "cupy-oom-frag.parquet"), "-o",
                                 str(tmp_path / "timeline.png"), "--png", str(tmp_path)])
    assert r.exit_code == 1 and "both the page (-o) and a --png figure" in r.output
    assert list(tmp_path.iterdir()) == []
