"""The ``report --advise --png`` figure: every setting ``tracekit advise`` tried, as a chart.

The chart has one bar per setting: its peak reserved bytes at the limit (green when it
fits, grey when it ran out, hatched when the result is the device-allocator model rather
than a replay), the limit as a solid line and the live-bytes lower bound as a dashed one;
each bar is labelled with the headroom (limit − peak reserved) and the price (device
allocations + frees); a star marks the recommendation. The axis starts just below the lower
bound, since the settings differ by a few percent of the limit. The page's advise table gives the
same numbers (``tracekit.report.page.data.advise_table``).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from tracekit.advise.evaluate import Outcome
from tracekit.advise.result import AdviseResult
from tracekit.advise.verdict import ORDER, Verdict
from tracekit.report.figures import new_figure
from tracekit.report.style import PALETTE, byte_scale
from tracekit.units import format_size

TITLE = "Advise: settings that fit under the limit"
CAPTION = (
    "Peak reserved bytes of the recorded run replayed under each setting at the limit (solid line): "
    "green fits, grey runs out, hatched is the device-allocator model instead of a replay. The dashed "
    "line is the lower bound (peak live bytes). Labels: headroom under the limit and the price in device "
    "allocations + frees. Only the recorded part of the run is checked."
)
MAX_BARS = 24


def _verdict(o: Outcome) -> Verdict:
    return o.verdict or (Verdict.FITS if o.fits else Verdict.NO)


def draw_advise(r: AdviseResult) -> Figure:
    """The chart for advise's result ``r``: every setting it tried, best verdict first (advise's verdicts,
    never recomputed here)."""
    rows = sorted(r.tried, key=lambda o: (ORDER[_verdict(o)], o.peak_reserved))[:MAX_BARS]
    fig = new_figure(12, 1.6 + 0.38 * len(rows))
    ax = fig.add_subplot()
    limit, bound = r.limit, r.lower_bound
    peaks = np.array([o.peak_reserved for o in rows], float)
    sc = byte_scale(max(float(peaks.max(initial=0.0)), float(limit)))
    y = np.arange(len(rows))[::-1]
    for yi, o, p in zip(y, rows, peaks, strict=True):
        v = _verdict(o)
        colour = (PALETTE[2] if o.fits else PALETTE[1] if v == Verdict.BORDERLINE else (0.7, 0.7, 0.7))
        ax.barh(yi, p / sc.div, color=colour, hatch="//" if not o.verified_by_replay else None,
                edgecolor="white")
        text = (f" headroom {format_size(o.headroom or 0)}, {o.price:,} calls" if o.fits
                else f" borderline: headroom {format_size(o.headroom or 0)} within the margin"
                if v == Verdict.BORDERLINE else " runs out")
        ax.text(p / sc.div, yi, text, va="center", fontsize=8)
    best = r.fits[0].label() if r.fits else None
    names = [_short(o.label()) + (" \u2605" if o.label() == best else "") for o in rows]
    ax.set_yticks(y, names, fontsize=8)
    ax.axvline(limit / sc.div, color="black", lw=1.4, label=f"limit {format_size(limit)}")
    ax.axvline(bound / sc.div, color="black", ls="--", lw=1.0, label=f"lower bound {format_size(bound)}")
    # Settings differ by a few percent of the limit: the axis starts near the lower bound, not at 0.
    lo = min(float(peaks.min(initial=float(limit))), float(bound)) * 0.97
    ax.set_xlim(lo / sc.div, max(float(peaks.max(initial=0.0)), float(limit)) / sc.div * 1.04
                + (limit - lo) / sc.div * 0.45)
    ax.set_xlabel(f"peak reserved at the limit ({sc.unit}; the axis starts at {format_size(lo)})")
    ax.grid(alpha=0.3, axis="x")
    fig.legend(loc="outside lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle("Advise: each setting replayed under the limit", fontsize=12)
    return fig


def _short(text: str, width: int = 64) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"
