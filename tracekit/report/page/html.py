"""The page itself: one HTML file, every script and style inlined, the data model as JSON.

The model is a ``<script type="application/json">`` element the page reads with
``JSON.parse``; every ``<`` in it is written ``\\u003c`` so no string from the trace
can close the element. The Content-Security-Policy allows nothing but the inlined
script and style blocks, each by its SHA-256 hash: no network, no other script, no
inline event handler, no ``eval``. The markup around the model is fixed text; the
page fills it from the model with ``textContent`` only.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import cache
from html import escape
from pathlib import Path

from tracekit.report.page.model import PageModel

ASSETS = Path(__file__).resolve().parent / "assets"
SCRIPTS = ("uPlot.iife.min.js", "flame.js", "page.js")
STYLES = ("uPlot.min.css", "page.css")


@cache
def _asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def _hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def model_json(model: PageModel) -> str:
    """The model as JSON safe inside a script element (``<`` escaped; no NaN)."""
    return json.dumps(model, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def csp(scripts: list[str], styles: list[str]) -> str:
    """default-src 'none'; the given script and style blocks by hash; canvas pictures as data: images."""
    return (
        "default-src 'none'; script-src "
        + " ".join(map(_hash, scripts))
        + "; style-src "
        + " ".join(map(_hash, styles))
        + "; img-src data:; base-uri 'none'; form-action 'none'"
    )


def page(model: PageModel) -> str:
    """The whole HTML document."""
    scripts = [_asset(s) for s in SCRIPTS]
    styles = [_asset(s) for s in STYLES]
    return "".join(
        [
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n',
            f'<meta http-equiv="Content-Security-Policy" content="{csp(scripts, styles)}">\n',
            '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
            f"<title>{escape(model['title'])}</title>\n",
            *(f"<style>{s}</style>\n" for s in styles),
            "</head><body>\n",
            _BODY,
            '<script type="application/json" id="model">',
            model_json(model),
            "</script>\n",
            *(f"<script>{s}</script>\n" for s in scripts),
            "</body></html>\n",
        ]
    )


_BODY = """<header><h1 id="title"></h1><p id="verdict"></p><p id="explanation"></p>
<section id="answer" hidden><h2>What to change</h2><p id="answer-text"></p>
<div class="paste"><pre id="answer-line"></pre><button id="copy-line" type="button">Copy</button>
<span id="copied" class="help" aria-live="polite"></span></div>
<div id="whole" hidden><p class="help">The trace ends at the failing request: record the whole run once
with room to finish (lift any limit the program sets itself), then advise on it at this limit:</p>
<div class="paste"><pre id="whole-lines"></pre><button id="copy-whole" type="button">Copy</button>
<span id="copied-whole" class="help" aria-live="polite"></span></div></div>
<p id="answer-margin" class="help"></p><p id="answer-checks" class="help"></p>
<div id="answer-cures" hidden></div></section>
<p id="status">Loading…</p></header>
<main>
<section id="s-timeline"><h2>Timeline</h2>
<p class="help">Drag to zoom, wheel to zoom at the pointer, double-click to reset; keys: + / - zoom,
Shift+←/→ pan, 0 reset. Click a point to show the allocator state at that event. Every line and mark is in
the legend under the chart (hover an entry for what it means); each curve is the minimum..maximum within a
bucket of events, so no spike is hidden.</p>
<div id="oom-strip" class="strip"></div>
<div id="timeline"></div>
<div id="frag-strip" hidden></div>
<div id="tl-legend" class="legend tl-legend"></div>
</section>
<section id="s-state"><h2>Allocator state</h2>
<div class="controls"><label>event <input id="scrub" type="range" min="0" max="0" value="0"></label>
<input id="scrub-seq" type="number" aria-label="seq"><button id="go-seq" type="button">go to seq</button>
<button id="prev" type="button">◀</button><button id="next" type="button">▶</button>
<span id="at"></span></div>
<p id="state-note" class="help"></p>
<canvas id="map" width="1200" height="320"></canvas>
<div id="request"></div><canvas id="request-bar" width="1200" height="12" hidden></canvas>
<div id="legend" class="legend"></div>
</section>
<section id="s-flame"><h2>Flame graph: what holds the live bytes</h2>
<p class="help">The blocks live at the selected event by call stack: the root on top, each frame below the
one that called it, as wide as the bytes it and what it calls hold. Click a frame to zoom into it, click it
(or an ancestor) again to zoom out; hover for its file, line, bytes and share. Keys: p peak, f fatal OOM,
[ / ] previous / next OOM, e the end (what was never freed), Escape the whole graph; Tab to the graph,
then the arrow keys move between frames and Enter zooms.</p>
</section>
<section id="s-budget"><h2>The device budget</h2><div id="budget"></div></section>
<section id="s-facts"><h2>Summary</h2><table id="facts" class="t"></table></section>
<section id="s-tables"></section>
<section id="s-baseline"></section>
</main>
<div id="tip" role="tooltip" hidden></div>
"""
