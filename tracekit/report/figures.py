"""Report figures, one function per figure; each returns a matplotlib ``Figure``.

Figures are built on ``matplotlib.figure.Figure`` directly (Agg, no pyplot
state), sized for a 1200-pixel-wide page, with byte axes in one binary unit
and time axes in seconds (see ``tracekit.report.style``). The memory map and
the OOM-moment figure live in their own modules because they also compute
block placements.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter

from tracekit.report.envelope import Envelope
from tracekit.report.style import GREY, RGB, SERIES, Scale, byte_scale, short_site
from tracekit.report.timeline import SERIES as TL_SERIES
from tracekit.report.timeline import TimelineData
from tracekit.units import format_size

if TYPE_CHECKING:
    from tracekit.analysis.leaks import SiteBytes
    from tracekit.report.sections import WhatIfRow

DPI = 100


def new_figure(width: float = 12.0, height: float = 5.0) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _draw_env(
    ax: Axes, env: Envelope, scale: float, colour: str, label: str, lw: float = 1.4, ls: str = "-"
) -> None:
    if len(env.x) == 0:
        return
    xs, lo, hi = env.steps()
    if not env.exact:
        ax.fill_between(xs, lo / scale, hi / scale, step="post", color=colour, alpha=0.25, lw=0)
    ax.step(xs, hi / scale, where="post", color=colour, lw=lw, ls=ls, label=label)


def draw_timeline(d: TimelineData, title: str) -> Figure:
    """Live, requested, reserved, largest free block, device free; fragmentation (%) in a strip below.

    The fragmentation axis is a separate strip sharing x (not a twin axis) so its band never lies
    over the memory curves.
    """
    if d.frag is not None:
        fig = new_figure(12, 6.6)
        ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1])
    else:
        fig = new_figure(12, 5.6)
        ax, ax2 = fig.add_subplot(), None
    labels = {key: text for _, key, text in TL_SERIES}
    if d.reserved_is_live:
        labels["live"] = "live = reserved (no segment rows)"
    top = max((np.nanmax(e.hi) for k, e in d.series.items() if k != "device_free" and len(e.hi)), default=0.0)
    top = max(top, d.limit or 0, (d.oom_reserved or 0) + (d.oom_request or 0))
    ymax = top / d.scale.div * 1.12 if top > 0 else 1.0
    if "device_free" in d.series and np.nanmin(d.series["device_free"].lo) / d.scale.div > ymax:
        dev = d.series["device_free"]
        labels["device_free"] += (
            f" (off scale: {format_size(np.nanmin(dev.lo))} to {format_size(np.nanmax(dev.hi))})"
        )
    for key, env in d.series.items():
        lw = 1.0 if key in ("requested", "device_free") else 1.5
        ls = ":" if key == "device_free" else "-"
        _draw_env(ax, env, d.scale.div, SERIES[key], labels[key], lw, ls)
    if d.limit:
        ax.axhline(
            d.limit / d.scale.div,
            color="#9467bd",
            ls="-.",
            lw=1.2,
            label=f"pool limit {format_size(d.limit)}",
        )
    ax.set_ylim(0, ymax)
    ax.set_ylabel(f"memory ({d.scale.unit})")
    ax.grid(alpha=0.3)
    if ax2 is not None and d.frag is not None:
        _draw_env(ax2, d.frag, 1.0, SERIES["frag"], "external fragmentation", 0.9)
        ax2.set_ylim(0, 105)
        ax2.set_yticks([0, 50, 100])
        ax2.set_ylabel("ext. frag. (%)", color=SERIES["frag"])
        ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0f}%"))
        ax2.grid(alpha=0.3)
        ax2.set_xlabel(d.axis.label)
        if d.oom_x is not None:
            ax2.axvline(d.oom_x, color="black", ls="--", lw=1.2)
    else:
        ax.set_xlabel(d.axis.label)
    for i, hx in enumerate(d.handled_x):
        label = f"OOM the program survived ({len(d.handled_x)})" if i == 0 else None
        ax.axvline(hx, color="#888888", ls=":", lw=0.9, gid="oom-handled", label=label)
    if d.measured_free is not None and len(d.measured_free[0]):
        mx, my = d.measured_free
        label = "device free (measured)"
        if np.nanmin(my) / d.scale.div > ymax:  # far above the pool's curves: say so in the legend
            label += f" (off scale: {format_size(np.nanmin(my))} to {format_size(np.nanmax(my))})"
        ax.plot(mx, my / d.scale.div, "o", color=SERIES["device_free"], ms=5, label=label)
    if d.oom_x is not None:
        ax.axvline(d.oom_x, color="black", ls="--", lw=1.2, gid="oom-marker", label=f"OOM (seq {d.oom_seq})")
        if d.oom_reserved is not None and d.oom_request:
            ax.vlines(
                d.oom_x,
                d.oom_reserved / d.scale.div,
                (d.oom_reserved + d.oom_request) / d.scale.div,
                color="black",
                lw=6,
                gid="oom-request",
                label=f"the request ({format_size(d.oom_request)}) on top of reserved",
            )
        ax.set_title("\n".join(textwrap.wrap(d.oom_text or "", 150)), fontsize=9, loc="left")
    elif d.frag is None:
        ax.set_title(
            "raw-device trace (no segment rows): no pool, so no free block or fragmentation to draw",
            fontsize=9,
            loc="left",
        )
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels() if ax2 is not None else ([], [])
    fig.legend(h1 + h2, l1 + l2, loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle(title, fontsize=12)
    return fig


def _pow2_label(v: float, _pos: Any = None) -> str:
    if v <= 0:
        return ""
    n = int(round(v))
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def draw_sizes(sizes: np.ndarray, title: str) -> Figure:
    """Histogram of requested sizes in power-of-two bins: allocation count (left), bytes (right)."""
    fig = new_figure(12, 4.2)
    ax_n, ax_b = fig.subplots(1, 2)
    sizes = sizes[sizes > 0].astype(np.float64)
    if len(sizes) == 0:
        for ax in (ax_n, ax_b):
            ax.text(0.5, 0.5, "no allocations", ha="center", va="center", transform=ax.transAxes)
        return fig
    # frexp's exponent e puts s in [2^(e-1), 2^e): an exact power-of-two bin without log rounding.
    expo = np.frexp(sizes)[1] - 1
    lo, hi = int(expo.min()), int(expo.max()) + 1
    counts = np.bincount(expo - lo, minlength=hi - lo)
    byt = np.bincount(expo - lo, weights=sizes, minlength=hi - lo)
    edges = 2.0 ** np.arange(lo, hi + 1)
    sc = byte_scale(byt.max())
    for ax, vals, ylabel in (
        (ax_n, counts, "allocations"),
        (ax_b, byt / sc.div, f"bytes requested ({sc.unit})"),
    ):
        ax.bar(
            edges[:-1],
            vals,
            width=np.diff(edges),
            align="edge",
            color=SERIES["live"],
            edgecolor="white",
            lw=0.5,
        )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(_pow2_ticks(lo, hi))
        ax.xaxis.set_major_formatter(FuncFormatter(_pow2_label))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.set_xlabel("requested size (power-of-two bins)")
        ax.set_ylabel(ylabel)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v == int(v) else f"{v:g}"))
        ax.grid(alpha=0.3, axis="y")
    ax_n.set_title("how many allocations of each size", fontsize=10)
    ax_b.set_title("how many bytes each size class requested", fontsize=10)
    fig.suptitle(title, fontsize=12)
    return fig


def _pow2_ticks(lo: int, hi: int) -> FixedLocator:
    step = max(1, int(np.ceil((hi - lo) / 8)))
    return FixedLocator([2.0**e for e in range(lo, hi + 1, step)])


def _barh_sites(
    ax: Axes, rows: Sequence[SiteBytes], colours: Mapping[str, RGB], title: str, empty: str
) -> None:
    ax.set_title(title, fontsize=10, loc="left")
    if not rows:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        return
    rows = rows[:10]
    sc = byte_scale(max(r.bytes for r in rows))
    y = np.arange(len(rows))[::-1]
    vals = np.array([r.bytes for r in rows], dtype=np.float64) / sc.div
    cols = [colours.get(r.site or "", GREY) for r in rows]
    ax.barh(y, vals, color=cols)
    ax.set_yticks(y, [short_site(r.site, 56) for r in rows], fontsize=8)
    for yi, v, r in zip(y, vals, rows, strict=True):
        ax.text(
            v,
            yi,
            f" {format_size(r.bytes)} in {r.blocks:,} block{'s' if r.blocks != 1 else ''}",
            va="center",
            fontsize=8,
        )
    ax.set_xlim(0, vals.max() * 1.35)
    ax.set_xlabel(f"bytes held ({sc.unit})")
    ax.grid(alpha=0.3, axis="x")


def draw_sites(
    at_peak: Sequence[SiteBytes], leaks: Sequence[SiteBytes], colours: Mapping[str, RGB], peak_text: str
) -> Figure:
    """Top call-sites by bytes live at the peak (top) and blocks never freed (bottom)."""
    n = max(len(at_peak[:10]), 1) + max(len(leaks[:10]), 1)
    fig = new_figure(12, 1.6 + 0.28 * n + 1.2)
    ax1, ax2 = fig.subplots(2, 1, height_ratios=[max(len(at_peak[:10]), 2), max(len(leaks[:10]), 2)])
    _barh_sites(
        ax1,
        at_peak,
        colours,
        f"call-sites holding the most bytes at the peak ({peak_text})",
        "no live blocks at the peak",
    )
    total = sum(r.bytes for r in leaks)
    _barh_sites(
        ax2,
        leaks,
        colours,
        f"blocks never freed by the end of the trace ({format_size(total)} in all)",
        "every block was freed by the end of the trace",
    )
    return fig


def draw_baseline(this: TimelineData, base: TimelineData, names: tuple[str, str]) -> Figure:
    """Live and reserved bytes of two traces on one axis (this trace thin, the baseline wide and dashed).

    Each trace is drawn from its own first event; the upper envelope is drawn as the line.
    """
    fig = new_figure(12, 5)
    ax = fig.add_subplot()
    top = max(
        float(np.nanmax(e.hi))
        for d in (this, base)
        for k, e in d.series.items()
        if k in ("live", "reserved") and len(e.hi)
    )
    sc: Scale = byte_scale(top)
    # The baseline goes underneath, wide and translucent, so equal curves still show both.
    for d, ls, lw, alpha, name in (
        (base, "--", 3.5, 0.45, f"baseline {names[1]}"),
        (this, "-", 1.4, 1.0, names[0]),
    ):
        for key in ("reserved", "live"):
            if key in d.series:
                xs, _, hi = d.series[key].steps()
                ax.step(
                    xs,
                    hi / sc.div,
                    where="post",
                    color=SERIES[key],
                    lw=lw,
                    ls=ls,
                    alpha=alpha,
                    label=f"{name}: {key}",
                )
        if d.oom_x is not None:
            ax.axvline(d.oom_x, color="black", ls=ls, lw=1.0, alpha=alpha, label=f"{name}: OOM")
    ax.set_ylim(0, top / sc.div * 1.12)
    ax.set_ylabel(f"memory ({sc.unit})")
    same = this.axis.label == base.axis.label
    ax.set_xlabel(this.axis.label if same else f"{this.axis.label} / baseline: {base.axis.label}")
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle(f"{names[0]} against baseline {names[1]}", fontsize=12)
    return fig


def draw_whatif(rows: Sequence[WhatIfRow], bound: float | None) -> Figure:
    """Smallest capacity per policy (bars, labelled with the overhead over the bound) and the lower bound."""
    fig = new_figure(12, 2.0 + 0.45 * len(rows))
    ax = fig.add_subplot()
    caps = np.array([np.nan if r.capacity_bytes is None else r.capacity_bytes for r in rows], float)
    sc = byte_scale(np.nanmax(np.append(caps, bound or 0.0)))
    y = np.arange(len(rows))[::-1]
    ax.barh(y, np.nan_to_num(caps) / sc.div, color=SERIES["reserved"])
    ax.set_yticks(y, [r.policy for r in rows])
    for yi, c, r in zip(y, caps, rows, strict=True):
        if np.isnan(c):
            text = f" {r.note or 'no fit found'}"
        else:
            over = r.overhead
            text = f" {format_size(c)}" + ("" if over is None else f" ({100 * over:+.1f}% over the bound)")
        ax.text(0 if np.isnan(c) else c / sc.div, yi, text, va="center", fontsize=9)
    if bound:
        ax.axvline(bound / sc.div, color="black", ls="--", lw=1.2, label=f"lower bound {format_size(bound)}")
        fig.legend(loc="outside lower center", fontsize=9, frameon=False)
    ax.set_xlim(0, np.nanmax(np.append(caps, bound or 0.0)) / sc.div * 1.35)
    ax.set_xlabel(f"smallest capacity without OOM ({sc.unit})")
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle("What-if: the smallest capacity each allocator needs", fontsize=12)
    return fig
