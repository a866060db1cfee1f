"""The memory map: address within the segments against time, one rectangle per block.

Each block is ``[t_malloc, t_free) x [offset, offset + rounded)`` on the
compacted address axis (``tracekit.report.blocks.address_layout``), coloured
by call-site (top sites from the shared palette, the rest grey), like the
active-memory / segment views of PyTorch's memory visualiser. Scale: the
``exact`` largest blocks (by bytes) are drawn as exact rectangles; every
other block is rasterised into a ``width x height`` grid whose cells hold the
fraction of the cell's area the block covers (bytes / cell bytes times time /
cell time, capped at 1), one layer per colour. The layers are summed with 2-D
prefix sums (four corner updates per block in one compiled loop), so cost
is O(blocks + cells) with no per-block Python, and the cell colour is the
occupancy-weighted mix of the layer colours with opacity = total occupancy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from tracekit.compiled import plain
from tracekit.report.blocks import AddressLayout, Spans
from tracekit.report.style import GREY, RGB, Legend, Scale, TimeAxis, byte_scale

SEGMENT_RGB = (0.93, 0.91, 0.84)  # reserved but not allocated: free space inside segments
SEGMENT_EDGE = (0.55, 0.52, 0.45)


@dataclass(frozen=True, eq=False)
class MapData:
    """What the memory map draws: exact rectangles, the aggregated raster and the legend."""

    axis: TimeAxis
    scale: Scale
    extent: tuple[float, float, float, float]  # x0, x1, y0, y1 in axis units (y in bytes)
    rects: np.ndarray  # (k, 4): x0, x1, y0, y1 (y in bytes)
    rect_rgb: np.ndarray  # (k, 3)
    image: np.ndarray | None  # (height, width, 4) RGBA, row 0 at the lowest offset
    seg_rects: np.ndarray  # (m, 4) segment lifetimes: x0, x1, y0, y1 (drawn behind the blocks)
    legend: Legend
    n_exact: int
    n_aggregated: int
    by_segment: bool


def map_data(
    b: Spans,
    layout: AddressLayout,
    x_of_index: np.ndarray,
    axis: TimeAxis,
    site_rgb: np.ndarray,
    legend: Legend,
    *,
    by_segment: bool = True,
    seg: Spans | None = None,
    exact: int = 2000,
    width: int = 1100,
    height: int = 420,
) -> MapData:
    """Place every block; ``x_of_index`` has one x per event plus one for 'end of trace'."""
    y0 = layout.offset(b.addr)
    y1 = y0 + b.size.astype(np.float64)
    x0, x1 = x_of_index[b.start], x_of_index[b.end]
    total = max(layout.total, 1.0)
    xmin, xmax = float(x_of_index[0]), float(x_of_index[-1])
    if xmax <= xmin:
        xmax = xmin + 1.0
    colour = np.where(b.site >= 0, b.site, len(site_rgb) - 1)
    if len(b) > exact:
        keep = np.argpartition(-b.size.astype(np.float64), exact)[:exact]
        rest = np.ones(len(b), dtype=bool)
        rest[keep] = False
    else:
        keep, rest = np.arange(len(b)), np.zeros(len(b), dtype=bool)
    rects = np.column_stack([x0[keep], x1[keep], y0[keep], y1[keep]])
    image = None
    if rest.any():
        image = _raster(
            x0[rest], x1[rest], y0[rest], y1[rest], colour[rest], site_rgb, (xmin, xmax, total), width, height
        )
    if seg is not None and len(seg):
        sy0 = layout.offset(seg.addr)
        segr = np.column_stack(
            [x_of_index[seg.start], x_of_index[seg.end], sy0, sy0 + seg.size.astype(np.float64)]
        )
    else:
        segr = np.zeros((0, 4))
    return MapData(
        axis,
        byte_scale(total),
        (xmin, xmax, 0.0, total),
        rects,
        site_rgb[colour[keep]],
        image,
        segr,
        legend,
        len(keep),
        int(rest.sum()),
        by_segment,
    )


@plain
def _corners(x0, x1, y0, y1, layer, xmin, xscale, yscale, w, h, diff):  # pragma: no cover - compiled
    """Add each block's weight at the four corners of its cell rectangle (2-D difference array)."""
    for i in range(len(x0)):
        cx0, cx1 = (x0[i] - xmin) * xscale, (x1[i] - xmin) * xscale
        ry0, ry1 = y0[i] * yscale, y1[i] * yscale
        c0 = min(max(int(np.floor(cx0)), 0), w - 1)
        c1 = min(max(c0 + 1, int(np.ceil(cx1))), w)
        r0 = min(max(int(np.floor(ry0)), 0), h - 1)
        r1 = min(max(r0 + 1, int(np.ceil(ry1))), h)
        wt = min(1.0, ry1 - ry0) * min(1.0, cx1 - cx0)
        k = layer[i]
        diff[k, r0, c0] += wt
        diff[k, r0, c1] -= wt
        diff[k, r1, c0] -= wt
        diff[k, r1, c1] += wt


def _raster(
    x0: np.ndarray,
    x1: np.ndarray,
    y0: np.ndarray,
    y1: np.ndarray,
    colour: np.ndarray,
    site_rgb: np.ndarray,
    box: RGB,
    w: int,
    h: int,
) -> np.ndarray:
    xmin, xmax, total = box
    # One layer per distinct colour, found on the small per-site table, not per block.
    layer_rgb, site_layer = np.unique(site_rgb, axis=0, return_inverse=True)
    layer = site_layer.ravel().astype(np.int64)[colour]
    n_layers = len(layer_rgb)
    diff = np.zeros((n_layers, h + 1, w + 1))
    _corners(x0, x1, y0, y1, layer, float(xmin), w / (xmax - xmin), h / total, w, h, diff)
    occ = diff.cumsum(axis=1).cumsum(axis=2)[:, :h, :w]
    occ = np.clip(occ, 0.0, None)
    tot = occ.sum(axis=0)
    rgb = np.einsum("lhw,lc->hwc", occ, layer_rgb) / np.maximum(tot, 1e-12)[..., None]
    alpha = np.clip(tot, 0.0, 1.0) * 0.95
    return np.concatenate([rgb, alpha[..., None]], axis=2)


def _verts(r: np.ndarray, div: float) -> np.ndarray:
    """(k, 4) rectangles x0, x1, y0, y1 -> (k, 4, 2) polygon corners, y divided into axis units."""
    y0, y1 = r[:, 2] / div, r[:, 3] / div
    return np.stack(
        [np.column_stack(c) for c in ((r[:, 0], y0), (r[:, 1], y0), (r[:, 1], y1), (r[:, 0], y1))], axis=1
    )


def draw_memory_map(d: MapData, title: str, oom_x: float | None = None) -> Figure:
    """Blocks over time on the compacted address axis, over their segments' lifetimes (pale)."""
    fig = Figure(figsize=(12, 6), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    xmin, xmax, _, total = d.extent
    div = d.scale.div
    if d.image is not None:
        ax.imshow(
            d.image,
            origin="lower",
            extent=(xmin, xmax, 0, total / div),
            aspect="auto",
            interpolation="nearest",
            zorder=1,
        )
    if len(d.seg_rects):
        ax.add_collection(
            PolyCollection(
                _verts(d.seg_rects, div),  # type: ignore[arg-type]
                facecolors=SEGMENT_RGB,
                edgecolors=SEGMENT_EDGE,
                linewidths=0.5,
                zorder=0,
            )
        )
    if len(d.rects):
        ax.add_collection(
            PolyCollection(
                _verts(d.rects, div),  # type: ignore[arg-type]
                facecolors=d.rect_rgb,
                edgecolors=d.rect_rgb * 0.7,
                linewidths=0.3,
                zorder=2,
            )
        )
    if oom_x is not None:
        ax.axvline(oom_x, color="black", ls="--", lw=1.2, zorder=4)
        ax.annotate(
            "OOM",
            (oom_x, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize=9,
            fontweight="bold",
        )
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(0, total / div)
    where = "segments" if d.by_segment else "the address ranges blocks used"
    ax.set_ylabel(f"offset within {where} ({d.scale.unit})")
    ax.set_xlabel(d.axis.label)
    handles = [Patch(color=c, label=s) for s, c in d.legend]
    handles.append(Patch(color=GREY, label="other call-sites"))
    if len(d.seg_rects):
        handles.append(Patch(facecolor=SEGMENT_RGB, edgecolor=SEGMENT_EDGE, label="segment, free inside"))
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False, title="call-site")
    note = f"{d.n_exact:,} largest blocks drawn exactly"
    if d.n_aggregated:
        note += f", {d.n_aggregated:,} smaller blocks aggregated per pixel"
    ax.set_title(
        note + ("; pale boxes are segments over their lifetime" if len(d.seg_rects) else ""),
        fontsize=9,
        loc="left",
    )
    fig.suptitle(title, fontsize=12)
    return fig
