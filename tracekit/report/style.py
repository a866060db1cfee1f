"""Human units and colours shared by every report figure.

Byte axes are scaled to one binary unit chosen from the largest value shown
(KiB below 1 MiB, MiB below 1 GiB, else GiB), so tick labels stay short.
Time axes are seconds from the first event (milliseconds for traces shorter
than a second, minutes beyond ten minutes); traces whose timestamps are only
the event index (``t_ns == seq``) are drawn against the event index instead.
Call-sites get one colour each for the top sites (ranked once per report, so
the same site has the same colour in every figure); every other site is grey.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracekit.inputs import plot_text

GREY = (0.62, 0.62, 0.62)
# tab10 without its grey, so grey can mean "any other site".
RGB = tuple[float, float, float]
Legend = list[tuple[str, RGB]]  # call-site label and its colour

PALETTE: tuple[RGB, ...] = (
    (0.122, 0.467, 0.706),
    (1.000, 0.498, 0.055),
    (0.173, 0.627, 0.173),
    (0.839, 0.153, 0.157),
    (0.580, 0.404, 0.741),
    (0.549, 0.337, 0.294),
    (0.890, 0.467, 0.761),
    (0.737, 0.741, 0.133),
    (0.090, 0.745, 0.812),
)
SERIES = {
    "live": "#1f77b4",
    "requested": "#17becf",
    "reserved": "#ff7f0e",
    "largest_free": "#2ca02c",
    "device_free": "#7f7f7f",
    "frag": "#d62728",
}


@dataclass(frozen=True)
class Scale:
    """A unit for an axis: values are divided by ``div`` and labelled ``unit``."""

    div: float
    unit: str


def byte_scale(max_bytes: float) -> Scale:
    """The binary unit that keeps the largest value between 1 and 1024."""
    m = float(max_bytes) if max_bytes == max_bytes else 0.0
    if m >= 1024**3:
        return Scale(1024.0**3, "GiB")
    if m >= 1024**2:
        return Scale(1024.0**2, "MiB")
    if m >= 1024:
        return Scale(1024.0, "KiB")
    return Scale(1.0, "bytes")


@dataclass(frozen=True)
class TimeAxis:
    """How event rows map to x: ``x = (t_ns - t0) / div`` or the event index."""

    label: str
    by_index: bool
    t0: int
    div: float

    def x(self, t_ns: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
        if self.by_index:
            assert index is not None
            return np.asarray(index, dtype=np.float64)
        return (np.asarray(t_ns, dtype=np.int64) - self.t0).astype(np.float64) / self.div


def time_axis(t_ns: np.ndarray, seq: np.ndarray) -> TimeAxis:
    """Seconds (or ms / min) from the first event; else the event index.

    The event index is used when times carry no information (all equal, or
    ``t_ns == seq``) and when one pause between two events is over 30% of the
    span, where a time axis would leave the events a sliver at either end.
    """
    if len(t_ns) == 0:
        return TimeAxis("event index", True, 0, 1.0)
    t0, span = int(t_ns[0]), int(t_ns[-1]) - int(t_ns[0])
    if span <= 0 or np.array_equal(t_ns.astype(np.int64), seq.astype(np.int64)):
        return TimeAxis("event index", True, 0, 1.0)
    pause = int(np.max(np.diff(t_ns))) if len(t_ns) > 1 else 0
    if pause > 0.3 * span:
        # One pause would take most of the width and squash every event into slivers.
        return TimeAxis(f"event index (time has a {pause / 1e9:.3g} s pause)", True, 0, 1.0)
    if span < 1e9:
        return TimeAxis("time since first event (ms)", False, t0, 1e6)
    if span > 600e9:
        return TimeAxis("time since first event (min)", False, t0, 60e9)
    return TimeAxis("time since first event (s)", False, t0, 1e9)


def short_site(site: str | None, width: int = 48) -> str:
    """``path/to/file.py:12:fn`` → ``fn (file.py:12)``, cut to ``width`` characters, drawn literally
    (``plot_text``: a call-site's ``$`` or control characters are the trace's, not markup)."""
    if not site:
        return "(no call-site)"
    site = plot_text(site)
    parts = site.rsplit(":", 2)
    if len(parts) == 3:
        path, line, fn = parts
        text = f"{fn} ({path.replace(chr(92), '/').rsplit('/', 1)[-1]}:{line})"
    else:
        text = site
    return text if len(text) <= width else text[: width - 1] + "…"


def site_colours(n_sites: int, top: np.ndarray) -> np.ndarray:
    """RGB per site index (row ``n_sites`` is 'no site'): palette for ``top``, grey for the rest."""
    rgb = np.tile(np.array(GREY), (n_sites + 1, 1))
    for k, s in enumerate(top[: len(PALETTE)]):
        rgb[int(s)] = PALETTE[k]
    return rgb
