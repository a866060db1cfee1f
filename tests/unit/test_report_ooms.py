"""The report marks every OOM, explains the fatal one with the device budget, and draws each device alone."""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
from test_analysis_budget import seed_trace
from test_analysis_ooms import CONV, cudnn_rows, trace_of, two_device_meta, two_device_rows

from tracekit.analysis import analyze_trace
from tracekit.trace import Source, TraceMeta, write_trace
from tracekit.trace.reader import Trace


def _write(trace: Trace, path: Path) -> Path:
    extras = None
    if trace.extras is not None:
        extras = {"device_free": trace.extras.column("device_free").combine_chunks()}
    return write_trace(path, trace.meta, trace.events, extras=extras)


def _text(page: str) -> str:
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<img[^>]*>", "", page))))


def test_timeline_marks_the_handled_ooms_and_the_fatal_one():
    from tracekit.report.figures import draw_timeline
    from tracekit.report.timeline import timeline_data

    an = analyze_trace(trace_of(cudnn_rows(), TraceMeta.new(Source.TORCH)))
    d = timeline_data(an.timeline, an.summary.to_dict())
    assert d.oom_seq == 8 and d.handled_x == (2.0, 4.0, 6.0)  # event index on x
    fig = draw_timeline(d, "cudnn")
    lines = [a for ax in fig.axes for a in ax.get_lines()]
    assert sorted(a.get_xdata()[0] for a in lines if a.get_gid() == "oom-handled") == [2.0, 4.0, 6.0]
    assert [a.get_xdata()[0] for a in lines if a.get_gid() == "oom-marker"] == [8.0]


def test_report_lists_every_oom_and_who_handled_them(tmp_path: Path):
    from tracekit.report import write_report

    p = _write(trace_of(cudnn_rows(), TraceMeta.new(Source.TORCH)), tmp_path / "c.parquet")
    text = _text(write_report(p, tmp_path / "c.html").read_text())
    assert "Out of memory on device 0: exhaustion (the program died of it)" in text
    assert f"4 OOMs in all, 3 handled: 3 at {CONV} (convolution workspace attempts" in text
    assert "Every OOM" in text and text.count(" handled ") >= 3 and " FATAL " in text


def test_report_shows_the_budget_and_measured_free(tmp_path: Path):
    from tracekit.report import write_report

    p = _write(seed_trace(), tmp_path / "s.parquet")
    text = _text(write_report(p, tmp_path / "s.html").read_text())
    assert "device free (measured at the OOM) 117.28 MiB (122,978,304 bytes)" in text
    assert "The device at start and at the OOM" in text
    assert "local memory (model) 264.00 MiB (276,824,064 bytes) 4.12 GiB (4,429,185,024 bytes) " \
           "+3.87 GiB (4,152,360,960 bytes) estimated" in text


def test_report_of_a_derived_free_does_not_call_it_device_free(tmp_path: Path):
    from tracekit.report import write_report

    tr = seed_trace(free_column=False)
    tr = Trace(None, tr.meta.with_extra(oom_states=None), tr.events, tr.mate, None, ())
    text = _text(write_report(_write(tr, tmp_path / "v1.parquet"), tmp_path / "v1.html").read_text())
    assert "free at start - the pool's growth (derived; the device was not measured) 3.98 GiB" in text
    assert "device free (measured" not in text


def test_report_draws_each_device_on_its_own(tmp_path: Path):
    from tracekit.report import write_report

    p = _write(trace_of(two_device_rows(), two_device_meta()), tmp_path / "two.parquet")
    out = write_report(p, tmp_path / "two.html", png_dir=tmp_path / "png")
    names = sorted(f.name for f in (tmp_path / "png").iterdir())
    kinds = ("memory-map", "oom-moment", "sites", "sizes", "timeline")
    assert names == sorted(f"{k}-device{d}.png" for k in kinds for d in (0, 1))
    text = _text(out.read_text())
    assert "Out of memory on device 1: limit" in text and "Each device on its own" in text
    assert "Device 0: Timeline" in text and "Device 1: The moment of the OOM" in text


def test_whatif_section_of_two_devices(tmp_path: Path):
    from tracekit.advise.capacity import whatif
    from tracekit.report.sections import whatif_rows, whatif_section

    res = whatif(trace_of(two_device_rows(), two_device_meta()), ["best-fit"], jobs=1)
    rows = whatif_rows(res.to_dict())
    assert [(r["policy"], r["capacity_bytes"]) for r in rows] == [
        ("device 0: best-fit", 8 << 20), ("device 1: best-fit", 300 << 20)]
    text, fig = whatif_section(res)
    assert "Device 1: lower bound (peak live bytes, 512 B rounded) 300.00 MiB" in text and fig is not None
