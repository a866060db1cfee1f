"""Per-pixel min/max envelopes: downsampling that never hides a peak.

A memory curve with ten million steps cannot be drawn point by point, and
plain decimation (every k-th point) drops exactly the short spikes that
explain an OOM. Instead the x range is cut into ``npix`` equal columns (one
per output pixel) and each non-empty column keeps the minimum and maximum of
the values it holds. The curve is a step function (a value holds until the
next event), so a column also includes the value carried in from the last
event before it. Guarantee: for every input point i in column b,
``lo[b] <= y[i] <= hi[b]``, and ``hi[b]`` / ``lo[b]`` are attained values, so
the global maximum and every local peak appear at their exact height.
NaN (a value that is not known) is ignored; a column of only NaN stays NaN.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Envelope:
    """One point per non-empty column: x of its first event, and the column's min and max."""

    x: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    exact: bool  # True when nothing was merged (lo == hi == y)
    # Where each column ends and the value its last event leaves behind: after a column the curve
    # holds that value (not the column's whole range) until the next non-empty column.
    x_end: np.ndarray | None = None
    last: np.ndarray | None = None

    def steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Points for a step-post band: each column's range, then its held last value to the next."""
        if self.exact or self.x_end is None or self.last is None:
            return self.x, self.lo, self.hi
        k = len(self.x)
        xs, lo, hi = np.empty(2 * k), np.empty(2 * k), np.empty(2 * k)
        xs[0::2], xs[1::2] = self.x, self.x_end
        lo[0::2], lo[1::2] = self.lo, self.last
        hi[0::2], hi[1::2] = self.hi, self.last
        return xs, lo, hi


def column_starts(x: np.ndarray, npix: int) -> np.ndarray:
    """Index of the first point of each non-empty pixel column; ``x`` must be non-decreasing."""
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    x0, x1 = float(x[0]), float(x[-1])
    if x1 <= x0:
        return np.zeros(1, dtype=np.int64)
    edges = np.linspace(x0, x1, npix + 1)[1:-1]
    starts = np.searchsorted(x, edges, side="left")
    return np.unique(np.concatenate(([0], starts[starts < n]))).astype(np.int64)


def envelope(x: np.ndarray, y: np.ndarray, npix: int = 1200) -> Envelope:
    """Min/max of ``y`` per pixel column of ``x`` (exact copy when ``len(x) <= 2 * npix``)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) <= 2 * npix:
        return Envelope(x, y, y, True)
    starts = column_starts(x, npix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.fmin.reduceat(y, starts)
        hi = np.fmax.reduceat(y, starts)
        # The value held on entry to a column is the one left by the previous event.
        carried = y[starts[1:] - 1]
        lo[1:] = np.fmin(lo[1:], carried)
        hi[1:] = np.fmax(hi[1:], carried)
    width = max((float(x[-1]) - float(x[0])) / npix, np.finfo(np.float64).tiny)  # all x equal: one column
    col = np.minimum(np.floor((x[starts] - x[0]) / width), npix - 1)
    x_end = np.minimum(x[0] + (col + 1) * width, x[-1])
    last = y[np.append(starts[1:], len(y)) - 1]
    return Envelope(x[starts], lo, hi, False, x_end, last)
