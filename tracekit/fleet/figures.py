"""Fleet figures: peaks per trace, diagnosis counts, and reserved bytes over normalised time.

Built on the single-trace report's helpers (``tracekit.report.figures.new_figure``,
``byte_scale``, the series colours), one function per figure, each returning
a matplotlib ``Figure``. Traces are drawn in the table's order (rank, then
path). The heat map has one row per trace and ``CURVE_BINS`` columns over
normalised time (0 = the trace's first event, 1 = its last); a cell is the
highest reserved bytes in that stretch of the trace, so two ranks of
different lengths line up start to end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from tracekit.report.figures import new_figure
from tracekit.report.style import GREY, SERIES, byte_scale

# One colour per diagnosis (the report's palette), for bars and counts.
DIAGNOSIS_COLOURS = {"fragmentation": "#d62728", "limit": "#9467bd", "overhead": "#8c564b",
                     "exhaustion": "#e377c2"}
LABELLED_AT_MOST = 64  # beyond this many traces the per-trace tick labels would overlap


def _ticks(ax: Axes, labels: Sequence[str], axis: str) -> None:
    if len(labels) > LABELLED_AT_MOST:
        return
    pos = np.arange(len(labels))
    if axis == "x":
        ax.set_xticks(pos, labels, rotation=60, ha="right", fontsize=8)
    else:
        ax.set_yticks(pos, labels, fontsize=8)


def draw_peaks(labels: Sequence[str], reserved: np.ndarray, live: np.ndarray,
               diagnosis: Sequence[str | None]) -> Figure:
    """Peak reserved (bars, coloured by the fatal OOM's diagnosis) and peak live (dots) per trace."""
    n = len(labels)
    fig = new_figure(12, 4.8 if n <= LABELLED_AT_MOST else 4.0)
    ax = fig.add_subplot()
    sc = byte_scale(float(np.nanmax(reserved)) if n else 0.0)
    colours = [DIAGNOSIS_COLOURS.get(d or "", SERIES["reserved"]) for d in diagnosis]
    x = np.arange(n)
    ax.bar(x, reserved / sc.div, color=colours, width=0.8, label="peak reserved")
    ax.plot(x, live / sc.div, "o", color=SERIES["live"], ms=4 if n <= LABELLED_AT_MOST else 2,
            label="peak live")
    for d, c in DIAGNOSIS_COLOURS.items():
        if d in diagnosis:
            ax.bar([0], [0], color=c, label=f"ran out of memory: {d}")
    _ticks(ax, labels, "x")
    if n > LABELLED_AT_MOST:
        ax.set_xlabel(f"{n} traces (in table order)")
    ax.set_ylabel(f"bytes ({sc.unit})")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=9, loc="upper right")
    fig.suptitle("Peak reserved and peak live bytes per trace", fontsize=12)
    return fig


def draw_diagnoses(counts: Sequence[tuple[str, int]]) -> Figure:
    """How many traces ended in each diagnosis, ran without an OOM, or could not be read."""
    fig = new_figure(8, 3.2)
    ax = fig.add_subplot()
    names = [k for k, _ in counts]
    vals = [v for _, v in counts]
    colours = [DIAGNOSIS_COLOURS.get(k, GREY if k == "unreadable" else SERIES["live"]) for k in names]
    bars = ax.barh(np.arange(len(names)), vals, color=colours)
    ax.bar_label(bars, padding=3, fontsize=9)
    ax.set_yticks(np.arange(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("traces")
    ax.set_xlim(0, max([*vals, 1]) * 1.15)
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle("Traces by outcome", fontsize=12)
    return fig


def draw_heatmap(labels: Sequence[str], curves: np.ndarray, oom_at: Sequence[float | None]) -> Figure:
    """Reserved bytes over normalised time, one row per trace; each fatal OOM is marked where it happened."""
    n = curves.shape[0]
    height = 2.0 + min(n, LABELLED_AT_MOST) * 0.22 if n <= LABELLED_AT_MOST else 7.0
    fig = new_figure(12, height)
    ax = fig.add_subplot()
    sc = byte_scale(float(np.nanmax(curves)) if curves.size else 0.0)
    im = ax.imshow(curves / sc.div, aspect="auto", interpolation="nearest", cmap="viridis",
                   extent=(0.0, 1.0, n - 0.5, -0.5))
    fig.colorbar(im, ax=ax, label=f"reserved ({sc.unit})", pad=0.01)
    marks = [(a, i) for i, a in enumerate(oom_at) if a is not None]
    if marks:
        ax.plot([a for a, _ in marks], [i for _, i in marks], "x", color="#d62728", ms=8, mew=2,
                clip_on=False, label="fatal OOM")
        ax.legend(fontsize=9, loc="upper left", bbox_to_anchor=(0, -0.12 if n <= 8 else -0.06))
    _ticks(ax, labels, "y")
    if n > LABELLED_AT_MOST:
        ax.set_ylabel(f"{n} traces (in table order)")
    ax.set_xlabel("normalised time (0 = first event, 1 = last event of each trace)")
    ax.set_xlim(0, 1)
    fig.suptitle("Reserved bytes over time, one row per trace", fontsize=12)
    return fig
