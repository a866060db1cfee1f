"""The OOM moment: each live segment as a bar of live blocks and free gaps, the request beside it.

At event index ``k`` (the OOM row, or the peak-reserved row when the trace
never ran out) the live blocks and segments are those of the analyzer's
``pool_state_at(events, mate, k + 1)``: allocated at or before ``k``, freed
after it. The free gaps inside each segment are ``PoolState.gaps`` (the
addresses no live block covers). A trace without segment rows is drawn as
one pseudo-segment spanning its live blocks.
At most ``max_rows`` segments are drawn: the one with the largest gap, then
the largest ones; the rest are summarised in the title.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tracekit.analysis.leaks import PoolState
from tracekit.report.style import Legend, byte_scale
from tracekit.units import format_size

FREE_RGB = (0.80, 0.93, 0.80)
GAP_EDGE = "#2ca02c"
REQUEST_RGB = "black"


@dataclass(frozen=True, eq=False)
class SegmentRow:
    lo: int
    size: int
    block_off: np.ndarray  # offsets of live blocks within the segment
    block_size: np.ndarray
    block_rgb: np.ndarray  # (m, 3)
    gap_off: np.ndarray
    gap_size: np.ndarray


@dataclass(frozen=True, eq=False)
class Moment:
    """The state drawn: shown segments, the largest gap anywhere, the request and what was left out."""

    index: int
    seq: int
    is_oom: bool
    request: int | None
    rows: list[SegmentRow]
    largest_row: int  # index into rows, -1 if nothing is free
    largest_off: int
    largest_gap: int
    n_segments: int
    hidden_bytes: int
    by_segment: bool


def moment(
    state: PoolState,
    k: int,
    seq: int,
    request: int | None,
    is_oom: bool,
    site_rgb: np.ndarray,
    max_rows: int = 24,
) -> Moment:
    """Segments, blocks and gaps of ``state`` (the pool right after event index ``k``)."""
    order = np.argsort(state.block_addr, kind="stable")
    addr, size = state.block_addr[order], state.block_size[order]
    site = state.block_site[order]
    col = np.where(site >= 0, site, len(site_rgb) - 1)
    by_segment = len(state.seg_addr) > 0
    if not by_segment and len(addr):  # one pseudo-segment spanning the live blocks
        lo = addr[:1]
        span = np.array([int(np.max(addr + size)) - int(addr[0])], dtype=np.uint64)
        state = replace(state, seg_addr=lo, seg_size=span, seg_stream=np.zeros(1, np.uint64))
    so = np.argsort(state.seg_addr, kind="stable")
    s_lo, s_size = state.seg_addr[so], state.seg_size[so]
    g_seg, g_start, g_len = state.gaps()
    rank = np.empty(len(so), np.int64)
    rank[so] = np.arange(len(so))
    g_row = rank[g_seg]  # gaps come in address order, so rows are ascending
    g_cut = np.searchsorted(g_row, np.arange(len(s_lo) + 1))
    g = np.searchsorted(s_lo, addr, side="right") - 1
    cut = np.searchsorted(g, np.arange(len(s_lo) + 1))
    rows, gaps_max = [], np.zeros(len(s_lo), dtype=np.int64)
    gap_at = np.zeros(len(s_lo), dtype=np.int64)
    for i in range(len(s_lo)):
        a, z = cut[i], cut[i + 1]
        off = (addr[a:z] - s_lo[i]).astype(np.int64)
        gl = g_len[g_cut[i]:g_cut[i + 1]]
        goff = g_start[g_cut[i]:g_cut[i + 1]] - np.int64(s_lo[i])
        rows.append(
            SegmentRow(int(s_lo[i]), int(s_size[i]), off, size[a:z].astype(np.int64),
                       site_rgb[col[a:z]], goff, gl)
        )
        if len(gl):
            j = int(np.argmax(gl))
            gaps_max[i], gap_at[i] = gl[j], goff[j]
    big = int(np.argmax(gaps_max)) if len(gaps_max) and gaps_max.max() > 0 else -1
    pick = [big] if big >= 0 else []
    for i in np.argsort(-s_size.astype(np.float64), kind="stable"):
        if len(pick) >= max_rows:
            break
        if int(i) != big:
            pick.append(int(i))
    pick.sort()
    hidden = int(s_size.sum()) - sum(int(s_size[i]) for i in pick)
    shown = [rows[i] for i in pick]
    largest_row = pick.index(big) if big >= 0 else -1
    return Moment(
        k,
        seq,
        is_oom,
        request,
        shown,
        largest_row,
        int(gap_at[big]) if big >= 0 else 0,
        int(gaps_max[big]) if big >= 0 else 0,
        len(s_lo),
        hidden,
        by_segment,
    )


def draw_moment(m: Moment, legend: Legend) -> Figure:
    """One horizontal bar per segment; the request drawn to scale under the largest free gap."""
    n = len(m.rows)
    fig = Figure(
        figsize=(12, 2.8 + 0.34 * max(n, 1) + (0.3 if m.request else 0)), dpi=100, layout="constrained"
    )
    ax = fig.add_subplot()
    xmax = max([r.size for r in m.rows] + [m.largest_off + (m.request or 0)] + [1])
    sc = byte_scale(xmax)
    div = sc.div
    polys, colours = [], []

    def rect(x0: float, x1: float, y: float, hgt: float) -> np.ndarray:
        return np.array([[x0, y - hgt], [x1, y - hgt], [x1, y + hgt], [x0, y + hgt]])

    labels = []
    for i, r in enumerate(m.rows):
        y = n - 1 - i
        ax.barh(y, r.size / div, height=0.7, color=FREE_RGB, edgecolor="0.4", lw=0.6)
        for off, sz, rgb in zip(r.block_off, r.block_size, r.block_rgb, strict=True):
            polys.append(rect(off / div, (off + sz) / div, y, 0.35))
            colours.append(rgb)
        labels.append(f"{format_size(r.size)} @ {r.lo:#x}")
    if polys:
        cols = np.array(colours)
        ax.add_collection(PolyCollection(polys, facecolors=cols, edgecolors=cols * 0.7, linewidths=0.3))
    if m.largest_row >= 0:
        y = n - 1 - m.largest_row
        ax.barh(
            y,
            m.largest_gap / div,
            left=m.largest_off / div,
            height=0.7,
            fill=False,
            edgecolor=GAP_EDGE,
            lw=2.2,
            gid="largest-gap",
        )
        if m.request:
            ax.barh(
                y - 0.5,
                m.request / div,
                left=m.largest_off / div,
                height=0.22,
                color=REQUEST_RGB,
                gid="request",
            )
            ax.text(
                (m.largest_off + m.request) / div,
                y - 0.5,
                f"  request {format_size(m.request)}",
                va="center",
                fontsize=8,
                color=REQUEST_RGB,
            )
    ax.set_yticks(np.arange(n)[::-1], labels, fontsize=8)
    if n == 0:
        ax.text(
            0.5, 0.5, "nothing was allocated at this moment", ha="center", va="center", transform=ax.transAxes
        )
    ax.set_ylim(-0.8 if m.request else -0.5, n - 0.5)
    ax.set_xlim(0, xmax / div * 1.18)
    ax.set_xlabel(
        f"offset within the {'segment' if m.by_segment else 'address range of live blocks'} ({sc.unit})"
    )
    what = (
        f"at the OOM (seq {m.seq}): request of {format_size(m.request)} "
        f"against a largest free gap of {format_size(m.largest_gap)}"
        if m.is_oom
        else f"no OOM in this trace; state at the peak of reserved memory (seq {m.seq}), "
        f"largest free gap {format_size(m.largest_gap)}"
    )
    more = (
        f"\n{m.n_segments - n} smaller segments ({format_size(m.hidden_bytes)}) not drawn"
        if m.n_segments > n
        else ""
    )
    ax.set_title(what + more, fontsize=9, loc="left")
    handles = [Patch(color=c, label=s) for s, c in legend]
    handles += [
        Patch(facecolor=FREE_RGB, edgecolor="0.4", label="free (inside segment)"),
        Patch(facecolor="none", edgecolor=GAP_EDGE, lw=2, label="largest free gap"),
    ]
    if m.request:
        handles.append(Patch(color=REQUEST_RGB, label="the request, to scale"))
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        "Segments at the moment of the OOM" if m.is_oom else "Segments at peak reserved", fontsize=12
    )
    return fig
