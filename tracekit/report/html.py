"""One self-contained HTML page: figures as base64 PNG, the summary as text tables.

The page loads nothing from anywhere: images are ``data:`` URIs, the style is
inline, and a Content-Security-Policy forbids every other source, so it opens
offline and can be attached to a bug report. A few lines of inline script
record, once the page has loaded, how many images decoded (``data-images`` on
the root element, ``"loaded/total"``), which the browser test reads.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass
from typing import Any

from tracekit.units import format_size

CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
STYLE = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1240px; color: #222; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 18px; margin-top: 32px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; font-size: 14px; }
td, th { border: 1px solid #ddd; padding: 3px 10px; text-align: left; vertical-align: top; }
th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
.verdict { background: #fff4f4; border-left: 4px solid #d62728; padding: 8px 12px; }
.ok { background: #f4fff4; border-left: 4px solid #2ca02c; padding: 8px 12px; }
p.caption { color: #555; font-size: 13px; margin-top: 2px; } code { font-size: 13px; }
"""
SCRIPT = """window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) { if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++; }
  document.documentElement.setAttribute('data-images', ok + '/' + imgs.length);
});"""


@dataclass(frozen=True)
class Rendered:
    """A figure rendered to PNG, with the text that goes around it."""

    key: str
    title: str
    caption: str
    png: bytes


def esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


BYTE_KEYS = frozenset(
    {
        "size",
        "rounded",
        "device_free",
        "free_in_pool",
        "largest_free_block",
        "min_largest_free_block",
        "bytes",
    }
)


def fmt_value(key: str, v: Any) -> str:
    """A summary value in human units: bytes as KiB/MiB/GiB, ratios as %, None as n/a."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    k = key.lower()
    if isinstance(v, int | float) and (k.endswith("_bytes") or k in BYTE_KEYS):
        return f"{format_size(v)} ({int(v):,} bytes)" if v > 1024 else f"{int(v):,} bytes"
    if ("fragmentation" in k or k in ("jw1", "jw2", "jw3", "jw4")) and isinstance(v, int | float):
        return f"{100 * v:.1f}%" if v == 0 or abs(v) >= 0.001 else f"{100 * v:.2g}%"
    if k == "duration_s" and isinstance(v, int | float):
        return f"{v:.3f} s"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def table(rows: list[list[str]], header: list[str] | None = None, numeric_cols: tuple[int, ...] = ()) -> str:
    """Rows of already-formatted text as an HTML table (cells escaped here)."""
    out = ["<table>"]
    if header:
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>")
    for r in rows:
        cells = (
            f'<td class="num">{esc(c)}</td>' if i in numeric_cols else f"<td>{esc(c)}</td>"
            for i, c in enumerate(r)
        )
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def figure_html(f: Rendered) -> str:
    b64 = base64.b64encode(f.png).decode("ascii")
    return (
        f'<h2 id="{esc(f.key)}">{esc(f.title)}</h2>\n'
        f'<img alt="{esc(f.title)}" src="data:image/png;base64,{b64}">\n'
        f'<p class="caption">{esc(f.caption)}</p>'
    )


def contents(sections: list[str]) -> str:
    """Links to every section heading (``<h2 id=...>``) in page order."""
    heads = re.findall(r'<h2 id="([^"]+)">([^<]+)</h2>', "\n".join(sections))
    links = " · ".join(f'<a href="#{i}">{t}</a>' for i, t in heads)  # already escaped when built
    return f'<p class="caption">Contents: {links}</p>' if heads else ""


def page(title: str, header_html: str, sections: list[str]) -> str:
    """The whole document; ``header_html`` and ``sections`` are trusted HTML built by this package."""
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>{esc(title)}</title>",
            f"<style>{STYLE}</style>",
            f"<script>{SCRIPT}</script>",
            "</head>",
            "<body>",
            f"<h1>{esc(title)}</h1>",
            header_html,
            contents(sections),
            *sections,
            "</body>",
            "</html>",
            "",
        ]
    )
