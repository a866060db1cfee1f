"""The report marks every OOM, explains the fatal one with the device budget, and draws each device alone."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
from test_analysis_budget import seed_trace
from test_analysis_ooms import CONV, cudnn_rows, trace_of, two_device_meta, two_device_rows

from tracekit.analysis import analyze_trace
from tracekit.trace import Source, TraceMeta, write_trace
from tracekit.trace.reader import Trace

MiB = 1 << 20


def _write(trace: Trace, path: Path) -> Path:
    extras = None
    if trace.extras is not None:
        extras = {"device_free": trace.extras.column("device_free").combine_chunks()}
    return write_trace(path, trace.meta, trace.events, extras=extras)


def _model(page: Path) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="model">(.*?)</script>', page.read_text(), re.S)
    assert m is not None
    return dict(json.loads(m.group(1)))


def test_timeline_marks_the_handled_ooms_and_the_fatal_one():
    from tracekit.report.figures import draw_timeline
    from tracekit.report.timeline import Marks, timeline_data

    an = analyze_trace(trace_of(cudnn_rows(), TraceMeta.new(Source.TORCH)))
    d = timeline_data(an.timeline, Marks.of(an.summary))
    assert d.oom_seq == 8 and d.handled_x == (2.0, 4.0, 6.0)  # event index on x
    fig = draw_timeline(d, "cudnn")
    lines = [a for ax in fig.axes for a in ax.get_lines()]
    assert sorted(a.get_xdata()[0] for a in lines if a.get_gid() == "oom-handled") == [2.0, 4.0, 6.0]
    assert [a.get_xdata()[0] for a in lines if a.get_gid() == "oom-marker"] == [8.0]


def test_report_groups_the_handled_ooms_by_call_site_and_handler(tmp_path: Path):
    """The fatal OOM's group first, then the three handled cuDNN attempts as one group with its count."""
    from tracekit.report import write_report

    p = _write(trace_of(cudnn_rows(), TraceMeta.new(Source.TORCH)), tmp_path / "c.parquet")
    m = _model(write_report(p, tmp_path / "c.html"))
    assert m["verdict"]["text"].startswith("fatal OOM at seq 8 on device 0: exhaustion")
    fatal, handled = m["oom_groups"]
    assert not fatal["handled"] and fatal["count"] == 1 and fatal["ids"] == [3]
    assert handled["handled"] and handled["site"] == CONV
    assert handled["count"] == 3 and handled["ids"] == [0, 1, 2]
    assert "cuDNN" in handled["handler"] and handled["rounded_min"] == handled["rounded_max"] == 4 << 30
    assert ["OOMs", "4 OOMs, 3 handled"] in m["facts"]


def test_report_shows_the_budget_and_measured_free(tmp_path: Path):
    from tracekit.report import write_report

    p = _write(seed_trace(), tmp_path / "s.parquet")
    m = _model(write_report(p, tmp_path / "s.html"))
    (d,) = m["oom_details"]
    assert d["device_free_source"] == "measured" and d["budget"]["changed"] == "local memory"
    parts = {b["label"]: {x["name"]: (x["bytes"], x["how"]) for x in b["parts"]}
             for b in (d["budget"]["start"], d["budget"]["oom"])}
    assert parts["at start"]["local memory"] == (276_824_064, "estimated")
    assert parts["at the OOM (seq 8)"]["local memory"] == (4_429_185_024, "estimated")
    assert parts["at the OOM (seq 8)"]["free"] == (122_978_304, "measured")
    assert m["timeline"]["measured_free"] is not None  # measured: points, not the derived curve
    assert "device_free" not in [s["key"] for s in m["timeline"]["series"]]
    assert d["budget"]["capped"] is None  # no pool cap: nothing to say about one


def test_report_of_a_derived_free_does_not_call_it_device_free(tmp_path: Path):
    from tracekit.report import write_report

    tr = seed_trace(free_column=False)
    tr = Trace(None, tr.meta.with_extra(oom_states=None), tr.events, tr.mate, None, ())
    m = _model(write_report(_write(tr, tmp_path / "v1.parquet"), tmp_path / "v1.html"))
    (d,) = m["oom_details"]
    assert d["device_free_source"] == "derived" and d["budget"] is None
    (free,) = [s for s in m["timeline"]["series"] if s["key"] == "device_free"]
    assert free["label"] == "device free, derived (right axis)" and free["axis"] == "device"
    assert "not measured" in free["help"] and m["timeline"]["measured_free"] is None


def test_report_draws_each_device_on_its_own(tmp_path: Path):
    from tracekit.report import write_report

    p = _write(trace_of(two_device_rows(), two_device_meta()), tmp_path / "two.parquet")
    out = write_report(p, tmp_path / "two.html", png_dir=tmp_path / "png")
    names = sorted(f.name for f in (tmp_path / "png").iterdir())
    kinds = ("memory-map", "oom-moment", "sites", "sizes", "timeline")
    assert names == sorted(f"{k}-device{d}.png" for k in kinds for d in (0, 1))
    m = _model(out)
    assert m["trace"]["devices"] == [0, 1] and m["trace"]["device"] == 1  # the fatal OOM's device is drawn
    assert m["verdict"]["text"].startswith("fatal OOM at seq") and ": limit " in m["verdict"]["text"]


def test_whatif_of_two_devices(tmp_path: Path):
    from tracekit.advise.capacity import whatif
    from tracekit.report.page.data import whatif_table
    from tracekit.report.sections import whatif_rows

    res = whatif(trace_of(two_device_rows(), two_device_meta()), ["best-fit"], jobs=1)
    rows = whatif_rows(res)
    assert [(r.policy, r.capacity_bytes) for r in rows] == [
        ("device 0: best-fit", 8 << 20), ("device 1: best-fit", 300 << 20)]
    t = whatif_table(res)
    assert [r[:2] for r in t["rows"]] == [["device 0: best-fit", 8 << 20], ["device 1: best-fit", 300 << 20]]
    assert t["note"] == ("lower bound (peak live bytes, 512 B rounded): device 0: 8.00 MiB; "
                         "device 1: 300.00 MiB")
