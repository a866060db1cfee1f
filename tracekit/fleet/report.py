"""The fleet report: one self-contained HTML page over many traces.

Made of the single-trace report's parts (``tracekit.report.html``: page,
tables, figures as ``data:`` PNGs, the Content-Security-Policy that keeps it
offline): the verdict (how many ran out of memory, the worst trace), peak
reserved and live bytes per trace, the traces by outcome, the heat map of
reserved bytes over normalised time, the groups by diagnosis and call-site,
the imbalance across ranks, every row, and the worst traces drawn with the
single-trace figures (rendered in the workers, passed here as PNG bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracekit.fleet import figures as ff
from tracekit.fleet.summary import FleetSummary, Group
from tracekit.inputs import safe_text
from tracekit.outputs import write_bytes
from tracekit.report import html
from tracekit.report.render import png_bytes
from tracekit.report.style import short_site
from tracekit.units import format_size

LEAD_FIGURES = ("timeline", "oom-moment", "memory-map")  # of each worst trace; the rest: its own report


def label(path: str, rank: int | None) -> str:
    """A trace's short name on an axis: ``rank 3`` where the rank is known, else the file name (its
    control characters escaped; ``png_bytes`` makes every text of a figure literal for matplotlib)."""
    return f"rank {rank}" if rank is not None else safe_text(Path(path).name)


def write_fleet_report(df: pl.DataFrame, summary: FleetSummary,
                       worst: Sequence[tuple[str, list[Any] | str]], output: Path) -> Path:
    """Write the page to ``output`` (atomically); ``worst`` pairs a path with its figures or an error."""
    ok = df.filter(pl.col("error").is_null())
    names = [label(p, r) for p, r in ok.select("path", "rank").rows()]
    figs = [
        html.Rendered("peaks", "Peaks per trace", _PEAKS_CAPTION, png_bytes(ff.draw_peaks(
            names, ok.get_column("peak_reserved_bytes").to_numpy().astype(float),
            ok.get_column("peak_live_bytes").to_numpy().astype(float),
            ok.get_column("oom_diagnosis").to_list()))),
        html.Rendered("outcomes", "Traces by outcome", _OUTCOME_CAPTION,
                      png_bytes(ff.draw_diagnoses(_outcomes(df, summary)))),
    ]
    if "reserved_curve" in ok.columns and ok.height:
        curves = np.array(ok.get_column("reserved_curve").to_list(), dtype=np.float64)
        heat = ff.draw_heatmap(names, curves, ok.get_column("oom_at").to_list())
        figs.append(html.Rendered("heatmap", "Reserved bytes over normalised time", _HEAT_CAPTION,
                                  png_bytes(heat)))
    sections = [html.figure_html(f) for f in figs]
    sections.append(_groups_section(summary))
    sections.append(_rows_section(df))
    sections.extend(_worst_sections(worst))
    title = f"tracekit fleet: {summary.traces} traces"
    doc = html.page(title, _header(summary), sections)
    write_bytes(output, doc.encode("utf-8"))
    return output


def _outcomes(df: pl.DataFrame, s: FleetSummary) -> list[tuple[str, int]]:
    out = [(g.key or "unknown", g.traces) for g in s.by_diagnosis]
    out.append(("no OOM", s.analyzed - s.out_of_memory))
    if s.errors:
        out.append(("unreadable", len(s.errors)))
    return out


def _header(s: FleetSummary) -> str:
    facts = [["traces", f"{s.traces:,}"], ["analyzed", f"{s.analyzed:,}"],
             ["could not be read", f"{len(s.errors):,}"], ["ran out of memory", f"{s.out_of_memory:,}"]]
    if s.imbalance is not None:
        im = s.imbalance
        ratio = f"{im.ratio:.2f}x" if im.ratio is not None else "n/a"
        facts.append([f"peak reserved across {im.over}",
                      f"max {format_size(im.max_bytes)}, median {format_size(im.median_bytes)}, "
                      f"max / median {ratio}"])
    box = "ok"
    verdict = "No trace ran out of memory."
    if s.out_of_memory:
        box = "verdict"
        top = s.by_diagnosis[0]
        verdict = (f"{s.out_of_memory} of {s.analyzed} traces ran out of memory; the most common cause: "
                   f"{top.key} ({top.traces}).")
    if s.worst is not None:
        w = s.worst
        verdict += safe_text(f" Worst: {w.path}: {w.why}. Its own report: {w.report_command}")
    return html.table(facts) + f'\n<p class="{box}">{html.esc(verdict)}</p>'


def _group_rows(groups: Sequence[Group]) -> list[list[str]]:
    return [[safe_text(g.key or "(no call-site)"), f"{g.traces:,}",
             ", ".join(map(str, g.ranks[:32])) or "n/a",
             ", ".join(safe_text(Path(p).name) for p in g.paths[:8]) + (" …" if len(g.paths) > 8 else "")]
            for g in groups]


def _groups_section(s: FleetSummary) -> str:
    head = ["", "traces", "ranks", "files"]
    parts = ['<h2 id="causes">Why they ran out of memory</h2>']
    if not s.out_of_memory:
        parts.append("<p>No trace ran out of memory.</p>")
    else:
        parts.append("<p>By diagnosis:</p>" + html.table(_group_rows(s.by_diagnosis), head, (1,)))
        parts.append("<p>By the failing request's call-site:</p>"
                     + html.table(_group_rows(s.by_site), head, (1,)))
    if s.errors:
        parts.append("<p>Traces that could not be read or analyzed:</p>"
                     + html.table([[safe_text(p), safe_text(e)] for p, e in s.errors], ["trace", "why"]))
    return "\n".join(parts)


_ROW_HEAD = ["trace", "rank", "events", "peak live", "peak reserved", "max ext. frag.", "OOMs (handled)",
             "fatal OOM", "at call-site", "never freed"]


def _rows_section(df: pl.DataFrame) -> str:
    rows = []
    for r in df.iter_rows(named=True):
        name, rank = safe_text(Path(r["path"]).name), "" if r["rank"] is None else str(r["rank"])
        if r["error"] is not None:
            rows.append([name, rank, "unreadable: see above"] + [""] * (len(_ROW_HEAD) - 3))
            continue
        fatal = "" if r["oom_seq"] is None else (
            f"{r['oom_diagnosis']}: {format_size(r['oom_size'])} at seq {r['oom_seq']}")
        rows.append([name, rank, f"{r['events']:,}", format_size(r["peak_live_bytes"]),
                     format_size(r["peak_reserved_bytes"]), html.fmt_value("fragmentation", r[
                         "max_external_fragmentation"]), f"{r['oom_count']} ({r['ooms_handled']})", fatal,
                     safe_text(short_site(r["oom_site"], 60)) if r["oom_site"] else "",
                     format_size(r["leaked_bytes"])])
    return '<h2 id="rows">Every trace</h2>\n' + html.table(rows, _ROW_HEAD, (1, 2, 3, 4, 5, 6, 9))


def _worst_sections(worst: Sequence[tuple[str, list[Any] | str]]) -> list[str]:
    out = []
    for k, (path, drawn) in enumerate(worst, 1):
        path = safe_text(path)  # a file name is text the page shows: its control characters escaped
        head = f'<h2 id="worst-{k}">Worst trace #{k}: {html.esc(Path(path).name)}</h2>'
        cmd = f"tracekit report {path}"
        if isinstance(drawn, str):
            out.append(f"{head}\n<p>Its figures could not be drawn: {html.esc(safe_text(drawn))}</p>")
            continue
        figs = [html.Rendered(f"worst-{k}-{r.key}", f"{r.title} ({Path(path).name})", r.caption, r.png)
                for key in LEAD_FIGURES for r in drawn if r.key == key]
        body = "\n".join(html.figure_html(f).replace("<h2 ", "<h3 ").replace("</h2>", "</h3>") for f in figs)
        out.append(f"{head}\n<p>{html.esc(path)}; every figure and number: <code>{html.esc(cmd)}</code></p>\n"
                   + body)
    return out


_PEAKS_CAPTION = (
    "Per trace: the highest reserved bytes (segments the allocator held; bars, coloured by the diagnosis "
    "of the trace's fatal OOM) and the highest live bytes (allocated blocks; dots). A bar far above its "
    "dot is memory held but not in use: cache and fragmentation."
)
_OUTCOME_CAPTION = (
    "How many traces ran out of memory, by the analyzer's diagnosis (fragmentation, limit, overhead, "
    "exhaustion; see docs/analysis.md), how many ran without running out, and how many could not be read."
)
_HEAT_CAPTION = (
    "One row per trace; x is each trace's own time scaled to 0..1 (its first to its last event), so runs "
    "of different lengths line up. A cell is the highest reserved bytes in that stretch. A cross marks "
    "the fatal OOM. Rows that grow brighter than the others are the ranks that need the most memory."
)
