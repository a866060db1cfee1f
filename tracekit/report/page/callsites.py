"""Call-sites as interned frames and stacks: a FRAME table and a STACK table.

A frame is (file, line, function), parsed from a trace call-site ``file:line:function``
(a site that does not parse is kept whole as the file, line -1, function ""). A stack is
a leaf frame and the stack it was called from (-1: none), so whole call stacks share
their common outer part. A trace of format 1 or 2 records one frame per event: stack
``i`` is then frame ``i`` with no parent, and the stack id of an event is its ``site``
index unchanged. Colours go to stacks by bytes x lifetime (``report.blocks.rank_sites``).
"""

from __future__ import annotations

from tracekit.report.page.model import Frames, Stacks

# Colour-blind-safe qualitative palette (Okabe-Ito, then Tableau's extras); grey means "other".
PALETTE: tuple[str, ...] = (
    "#0072b2",
    "#e69f00",
    "#009e73",
    "#d55e00",
    "#cc79a7",
    "#56b4e9",
    "#f0e442",
    "#8c564b",
    "#9467bd",
    "#bcbd22",
    "#17becf",
    "#7f3c8d",
)


def parse_site(site: str) -> tuple[str, int, str]:
    """``"a/b.py:151:forward"`` -> ``("a/b.py", 151, "forward")``; anything else -> ``(site, -1, "")``."""
    parts = site.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit():
        return parts[0], int(parts[1]), parts[2]
    if len(parts) >= 2 and parts[-1].isdigit():  # "file:line" without a function
        return site.rsplit(":", 1)[0], int(parts[-1]), ""
    return site, -1, ""


def one_frame_stacks(sites: tuple[str, ...]) -> tuple[Frames, Stacks]:
    """Frame and stack tables for a trace whose call-sites are one frame each."""
    parsed = [parse_site(s) for s in sites]
    frames = Frames(file=[p[0] for p in parsed], line=[p[1] for p in parsed], function=[p[2] for p in parsed])
    return frames, Stacks(frame=list(range(len(sites))), parent=[-1] * len(sites))
