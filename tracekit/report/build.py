"""The matplotlib figures, in one place: ``report --png`` (``write_figures``), ``fleet`` (``build_figures``).

The report itself is the page (``tracekit.report.page``); these are the same findings as pictures to
paste into an issue, drawn from the results the page was built from. Order of work: the analyzer's
summary and per-event timeline drive the timeline; block placements come from the trace's own events
(``tracekit.report.blocks``) for the memory map, the OOM moment and the call-sites at the peak.
Call-sites are ranked once (bytes x lifetime) so each keeps one colour across figures. Every PNG is
checked against every input and output before anything is written, and written through
``tracekit.outputs`` (a temporary name beside the target, renamed), so an interrupted run never
leaves a half-written file and an input is never overwritten.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.figure import Figure

from tracekit.analysis.analyze import AnalysisResult
from tracekit.analysis.leaks import by_site, pool_state_at
from tracekit.errors import OutputError
from tracekit.inputs import safe_text
from tracekit.outputs import check_folder, check_output, write_bytes
from tracekit.report import blocks as blk
from tracekit.report import figures, html
from tracekit.report.memory_map import draw_memory_map, map_data
from tracekit.report.oom_view import draw_moment, moment
from tracekit.report.render import Pending, png_bytes, render
from tracekit.report.sections import shown_devices, whatif_rows
from tracekit.report.style import PALETTE, RGB, Legend, short_site, site_colours, time_axis
from tracekit.report.timeline import Marks, TimelineData, timeline_data
from tracekit.trace import Op, Trace
from tracekit.trace.devices import select_device
from tracekit.trace.events import seq_row

if TYPE_CHECKING:
    from tracekit.advise.capacity import WhatIfResult
    from tracekit.advise.result import AdviseResult
    from tracekit.analysis.summary import Summary


def _index_of_seq(trace: Trace, seq: int) -> int:
    return min(seq_row(trace.events.seq, seq), len(trace.events) - 1)


def _analyze(trace: Trace, analysis: AnalysisResult | None) -> AnalysisResult:
    if analysis is None or analysis.timeline is None:  # the timeline figure needs it
        from tracekit.analysis import analyze_trace

        analysis = analyze_trace(trace, timeline=True)
    return analysis


def build_figures(
    trace: Trace, analysis: AnalysisResult | None, name: str
) -> tuple[list[html.Rendered], TimelineData, Summary]:
    """Every single-trace figure, rendered, plus the timeline data and the summary they were drawn from.

    A trace of several devices gets each figure once per device shown (``shown_devices``: at
    most eight; keys ``KEY-deviceN``), each drawn from that device's events, timeline and
    summary alone; the timeline data returned is the reported device's.
    """
    analysis = _analyze(trace, analysis)
    summary = analysis.summary
    if not summary.devices:
        out, tl = _device_figures(trace, _timeline_of(analysis), summary, name, "")
        return render(out), tl, summary
    out, main_tl = [], None
    for part in shown_devices(summary):  # each device's own Summary
        d = part.device or 0
        rows = _device_rows(_timeline_of(analysis), d)
        figs, tl = _device_figures(select_device(trace, d), rows, part, f"{name}, device {d}", f"-device{d}")
        out += [replace(p, title=f"Device {d}: {p.title}") for p in figs]
        if d == summary.device:
            main_tl = tl
    assert main_tl is not None
    return render(out), main_tl, summary


def _device_figures(trace: Trace, table: pa.Table, summary: Summary, name: str,
                    suffix: str) -> tuple[list[Pending], TimelineData]:
    """The figures of one device, not drawn yet (``suffix`` appended to every key).

    What only one figure needs (the memory map's raster, the pool at the OOM or the peak) is
    computed when that figure is drawn, so it is shared out with the drawing (``render``).
    """
    ev = trace.events
    tl = timeline_data(table, Marks.of(summary))
    out = [Pending("timeline", "Timeline", _TIMELINE_CAPTION, partial(figures.draw_timeline, tl, name))]
    if len(ev) == 0:
        return _suffixed(out, suffix), tl
    b = blk.blocks(trace)
    top = blk.rank_sites(b, len(ev.sites))
    rgb = site_colours(len(ev.sites), top)
    legend = [(short_site(ev.sites[int(s)], 60), PALETTE[i]) for i, s in enumerate(top[: len(PALETTE)])]
    by_name = {ev.sites[int(s)]: PALETTE[i] for i, s in enumerate(top[: len(PALETTE)])}
    title = "The moment of the OOM" if summary.oom is not None else "Segments at peak reserved"
    sizes = ev.size[ev.op == Op.MALLOC]
    out += [
        Pending("memory-map", "Memory map", _MAP_CAPTION,
                partial(_memory_map, trace, b, rgb, legend, name, tl.oom_x)),
        Pending("oom-moment", title, _MOMENT_CAPTION, partial(_moment, trace, summary, rgb, legend)),
        Pending("sizes", "Allocation sizes", _SIZES_CAPTION, partial(figures.draw_sizes, sizes, name)),
        Pending("sites", "Call-sites at the peak, and blocks never freed", _SITES_CAPTION,
                partial(_sites, trace, summary, by_name)),
    ]
    return _suffixed(out, suffix), tl


def _memory_map(trace: Trace, b: Any, rgb: np.ndarray, legend: Legend, name: str,
                oom_x: Any) -> Figure:
    ev = trace.events
    seg = blk.segments(trace)
    axis = time_axis(ev.t_ns, ev.seq)
    xs = axis.x(ev.t_ns, np.arange(len(ev)))
    x_end = np.append(xs, xs[-1] + max((xs[-1] - xs[0]) * 1e-3, 1e-9))
    layout, by_seg = blk.layout_for(b, seg)
    md = map_data(b, layout, x_end, axis, rgb, legend, by_segment=by_seg, seg=seg)
    return draw_memory_map(md, name, oom_x)


def _moment(trace: Trace, summary: Summary, rgb: np.ndarray, legend: Legend) -> Figure:
    """The segments at the fatal OOM (its request drawn under the largest gap), else at peak reserved."""
    ev, oom = trace.events, summary.oom
    if oom is not None:
        k = _index_of_seq(trace, oom.seq)
        m = moment(pool_state_at(ev, trace.mate, k + 1), k, oom.seq, oom.rounded or oom.size, True, rgb)
    else:
        seq = summary.peak_reserved_seq
        k = _index_of_seq(trace, seq) if seq is not None else len(ev) - 1
        m = moment(pool_state_at(ev, trace.mate, k + 1), k, int(ev.seq[k]), None, False, rgb)
    return draw_moment(m, legend)


def _sites(trace: Trace, summary: Summary, by_name: dict[str, RGB]) -> Figure:
    """The call-sites holding the most at peak live bytes, and the blocks never freed."""
    ev = trace.events
    pk = summary.peak_live_seq
    kp = _index_of_seq(trace, pk) if pk is not None else len(ev) - 1
    peak = pool_state_at(ev, trace.mate, kp + 1)  # right after the peak event
    at_peak = by_site(peak.block_site, peak.block_size, ev.sites)
    return figures.draw_sites(at_peak, summary.leaks, by_name, f"seq {int(ev.seq[kp])}")


def _suffixed(pending: list[Pending], suffix: str) -> list[Pending]:
    return [replace(p, key=p.key + suffix) for p in pending] if suffix else pending


def write_figures(
    trace: Trace,
    analysis: AnalysisResult,
    png_dir: Path,
    *,
    name: str,
    inputs: tuple[Path, ...] = (),
    outputs: tuple[Path, ...] = (),
    baseline: tuple[str, Trace, AnalysisResult] | None = None,
    whatif: WhatIfResult | None = None,
    advise: AdviseResult | None = None,
    force: bool = False,
) -> Path:
    """Write every figure of ``trace`` as a PNG into ``png_dir`` (``tracekit report --png``), drawn from
    the results the page was built from: nothing is read or computed again.

    Every PNG is checked against ``inputs`` and ``outputs`` (the page) before any is written; existing
    ones are refused unless ``force``. Returns ``png_dir``.
    """
    check_folder(png_dir, "--png")
    rendered, tl, summary = build_figures(trace, analysis, name)
    if baseline is not None:
        base_name, _, base_analysis = baseline
        base_marks = Marks.of(base_analysis.summary)
        base_tl = timeline_data(_timeline_of(base_analysis), base_marks)
        if base_tl.axis.label != tl.axis.label:  # seconds against event index cannot share an axis
            rows = _timeline_of(analysis)
            if summary.devices:
                rows = _device_rows(rows, summary.device or 0)
            tl = timeline_data(rows, Marks.of(summary), by_index=True)
            base_tl = timeline_data(_timeline_of(base_analysis), base_marks, by_index=True)
        fig = figures.draw_baseline(tl, base_tl, (name, base_name))
        rendered.append(html.Rendered("baseline", "Against the baseline", _BASELINE_CAPTION, png_bytes(fig)))
    if whatif is not None:
        rows = whatif_rows(whatif)
        if rows:
            fig = figures.draw_whatif(rows, whatif.lower_bound)
            title = "What-if: smallest capacity per allocator"
            rendered.append(html.Rendered("whatif", title, _WHATIF_CAPTION, png_bytes(fig)))
    if advise is not None:
        from tracekit.report.advise_view import CAPTION, TITLE, draw_advise

        rendered.append(html.Rendered("advise", TITLE, CAPTION, png_bytes(draw_advise(advise))))
    folder = Path(png_dir)
    pngs = [(folder / f"{r.key}.png", r.png) for r in rendered]
    for p, _ in pngs:  # a figure at the page's own path would be overwritten by the page
        if any(os.path.abspath(p) == os.path.abspath(o) for o in outputs):
            raise OutputError(f"{safe_text(p)}: both the page (-o) and a --png figure; choose another -o "
                              "or --png folder")
    _make_folder(folder)  # every output is checked and the folder made before anything is written
    for p, _ in pngs:
        check_output(p, (*inputs, *outputs), option="--png", force=force)
    for p, data in pngs:
        write_bytes(p, data)
    return folder


def _timeline_of(analysis: AnalysisResult) -> pa.Table:
    if analysis.timeline is None:
        raise ValueError("the figures draw the analyzer's timeline: analyze with timeline=True")
    return analysis.timeline


def _device_rows(table: pa.Table, device: int) -> pa.Table:
    """The timeline rows of ``device`` (a trace of several devices)."""
    return table.filter(pc.equal(table.column("device"), pa.scalar(device, pa.int16())))


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"{folder}: cannot make the --png folder ({e.strerror or e})") from None


_TIMELINE_CAPTION = (
    "Bytes over time: live (allocated blocks, after rounding), requested (what the program asked for), "
    "reserved (segments the pool holds), the largest free block inside the segments, free at start minus "
    "reserved where the device total is known (dotted; derived, it misses whatever else took memory), and "
    "the device free measured at the pool's device allocations and at OOMs (points). The strip below: "
    "external fragmentation = 1 - largest free block / free in pool. At the fatal OOM (dashed line) the "
    "black bar is the failing request stacked on the reserved bytes; grey dotted lines are OOMs the "
    "program survived. "
    "Shaded bands are the min..max within one pixel column, so no spike is hidden."
)
_MAP_CAPTION = (
    "Each rectangle is one block: from its malloc to its free (or the end of the trace) along x, its address "
    "range within the segments along y. Colours name the call-sites that hold the most bytes over time; grey "
    "is every other site. Pale boxes are segments over their lifetime: pale area is reserved but free."
)
_MOMENT_CAPTION = (
    "Every segment as a bar: coloured pieces are live blocks, pale green is free space inside the segment. "
    "The largest free gap is outlined; the black bar under it is the failing request at the same scale."
)
_SIZES_CAPTION = "Requested sizes in power-of-two bins: left, how many allocations; right, how many bytes."
_SITES_CAPTION = (
    "Top: the call-sites holding the most live bytes at the moment of peak live memory. Bottom: "
    "blocks still live when the trace ended, grouped by call-site."
)
_BASELINE_CAPTION = (
    "Live and reserved bytes of this trace (solid) and the baseline (dashed), each from its start."
)
_WHATIF_CAPTION = (
    "The smallest capacity at which each allocator replays the trace without running out, "
    "against the lower bound (peak live bytes, 512 B rounded: requests rounded up to 512 B, failed "
    "requests counted as live)."
)
