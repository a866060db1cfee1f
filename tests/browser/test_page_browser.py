"""The browser report in a real browser: Playwright drives headless Chromium over the written page.

Needs the ``playwright`` Python package (``pip install -e '.[dev]'``) and Debian's
``chromium`` (``apt-get install chromium``); Playwright's own browser download is not
used. Each test skips, saying how to install both, where either is missing. Answers are
checked against the analyzer (``pool_state_at``) and the trace's own columns.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # shared hand-built traces
from test_page_model import HOSTILE, ooms, page_trace, read_model

from tracekit.analysis.leaks import pool_state_at
from tracekit.report.page import write_page
from tracekit.trace import read_trace

CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
INSTALL = ("install the Python package with `pip install playwright` (it is in tracekit's dev extra) and "
           "Debian's browser with `apt-get install chromium`; `playwright install` is not needed")
TRACES = Path(__file__).resolve().parents[2] / "traces"

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(sync_playwright is None or CHROMIUM is None,
                                 reason=f"Playwright or Chromium missing: {INSTALL}")]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_playwright is not None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


class Opened:
    """A page opened from ``file://`` with its console errors and any dialog collected."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.page: Page = browser.new_page(viewport={"width": 1400, "height": 1000})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("dialog", lambda d: (self.errors.append("dialog: " + d.message), d.dismiss()))
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function("window.tracekit && window.tracekit.ready", timeout=30_000)

    def live_mallocs(self) -> list[int]:
        """Malloc event index of every block on the memory map now."""
        return sorted(self.page.evaluate(
            "tracekit.view.blocks.map(b => tracekit.model.state.blocks.malloc[b])"))


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("page")
    out = {name: write_page(TRACES / f"{name}.parquet", tmp / f"{name}.html")
           for name in ("torch-handled-oom", "cupy-seed")}
    out["hand"] = write_page(page_trace(tmp / "hand.parquet"), tmp / "hand.html",
                             baseline=page_trace(tmp / "base.parquet", oom=False))
    out["hostile"] = write_page(page_trace(tmp / "hostile.parquet", HOSTILE), tmp / "hostile.html")
    return out


@pytest.mark.parametrize("name", ["torch-handled-oom", "cupy-seed", "hand"])
def test_loads_without_console_error(browser: Any, pages: dict[str, Path], name: str) -> None:
    o = Opened(browser, pages[name])
    assert o.errors == []
    assert o.page.text_content("#status") == ""
    assert o.page.locator("#timeline canvas").count() >= 1
    o.page.close()


def test_click_on_the_fatal_oom_shows_its_state(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["torch-handled-oom"])
    trace = read_trace(TRACES / "torch-handled-oom.parquet")
    m = read_model(pages["torch-handled-oom"])
    fatal = next(x for x in ooms(m) if not x["handled"])
    o.page.click("#timeline")  # somewhere else first, so the click below is what moves the state
    o.page.click("button.oom.fatal")
    assert o.page.get_attribute("#at", "data-seq") == str(fatal["seq"])
    ref = pool_state_at(trace.events, trace.mate, fatal["index"] + 1)
    assert o.live_mallocs() == sorted(ref.block_index.tolist())
    req = o.page.text_content("#request") or ""
    assert "Fatal OOM" in req and "121.50 MiB" in req and "largest free block 61.25 MiB" in req
    # The request is drawn to the map's scale: ceil(rounded / bytes per pixel) pixels.
    bpp = o.page.evaluate("tracekit.view.bpp")
    cells = int(np.ceil(fatal["rounded"] / bpp))
    area = o.page.evaluate("(c => c.width * c.height)(document.getElementById('request-bar'))")
    assert area >= min(cells, 1200)
    assert o.page.evaluate("tracekit.view.largest") == fatal["largest_free_block"]
    assert o.errors == []
    o.page.close()


@pytest.mark.parametrize("name", ["torch-handled-oom", "cupy-seed"])
def test_every_oom_is_reached_from_the_summary(browser: Any, pages: dict[str, Path], name: str) -> None:
    """Each OOM is a button of the strip (the fatal ones, the first of each handled group) or an entry of
    its group's list; the table of every OOM reaches each too."""
    o = Opened(browser, pages[name])
    m = read_model(pages[name])
    assert ooms(m)
    for x in ooms(m):
        button = o.page.locator(f"#oom-strip button.oom[data-oom='{x['id']}']")
        if button.count():
            button.click()
        else:
            o.page.locator("#oom-strip select.oom-pick", has=o.page.locator(f"option[value='{x['id']}']")
                           ).select_option(str(x["id"]))
        assert o.page.get_attribute("#at", "data-seq") == str(x["seq"])
    o.page.click("tr.link[data-oom='0']")
    assert o.page.get_attribute("#at", "data-seq") == str(ooms(m)[0]["seq"])
    o.page.close()


def test_the_oom_call_site_is_analyzes_label(browser: Any, pages: dict[str, Path]) -> None:
    """torch-handled-oom: the table of every OOM, the OOM strip, the request under the map and the flame
    graph's note name each OOM's call-site exactly as ``tracekit analyze`` does; legend entries differ."""
    from tracekit.analysis import analyze_trace

    summary = analyze_trace(read_trace(TRACES / "torch-handled-oom.parquet")).summary
    o = Opened(browser, pages["torch-handled-oom"])
    p = o.page
    cells = p.evaluate("[...document.querySelectorAll('tr.link[data-oom]')]"
                       ".map((r) => [Number(r.dataset.oom), r.lastElementChild.textContent])")
    assert sorted(cells) == [[i, x.site] for i, x in enumerate(summary.ooms)]
    fatal = next(i for i, x in enumerate(summary.ooms) if not x.handled)
    label = summary.ooms[fatal].site
    assert label == "scripts/torch_workload_resnet.py:43 in main → torchvision/models/resnet.py:147"
    assert (p.get_attribute(f"button.oom[data-oom='{fatal}']", "title") or "").endswith(" at " + label)
    p.click("button.oom.fatal")
    assert (p.text_content("#request p.req") or "").endswith("; call-site: " + label)
    assert f"at {label} came from" in (p.text_content(".fl-note") or "")
    legend = p.evaluate("[...document.querySelectorAll('#legend .litem')].map((e) => e.textContent)")[:-2]
    assert legend and len(set(legend)) == len(legend)
    assert all("_conv_forward" not in x and " → torch/" not in x for x in legend)
    assert o.errors == []
    p.close()


def test_scrub_to_a_seq_shows_the_blocks_live_there(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["cupy-seed"])
    trace = read_trace(TRACES / "cupy-seed.parquet")
    ev = trace.events
    k = len(ev) // 2
    o.page.fill("#scrub-seq", str(int(ev.seq[k])))
    o.page.click("#go-seq")
    assert o.page.get_attribute("#at", "data-seq") == str(int(ev.seq[k]))
    assert o.live_mallocs() == sorted(pool_state_at(ev, trace.mate, k + 1).block_index.tolist())
    o.page.focus("#scrub")
    for _ in range(3):
        o.page.keyboard.press("ArrowRight")
    assert o.page.get_attribute("#at", "data-seq") == str(int(ev.seq[k + 3]))
    assert o.live_mallocs() == sorted(pool_state_at(ev, trace.mate, k + 4).block_index.tolist())
    o.page.keyboard.press("ArrowLeft")
    assert o.live_mallocs() == sorted(pool_state_at(ev, trace.mate, k + 3).block_index.tolist())
    assert o.errors == []
    o.page.close()


def _hover_block(o: Opened, malloc_index: int) -> str:
    bid = o.page.evaluate(f"Array.from(tracekit.model.state.blocks.malloc).indexOf({malloc_index})")
    o.page.locator("#map").scroll_into_view_if_needed()
    xy = o.page.evaluate(f"tracekit.locate({bid})")
    assert xy is not None, "the block is not on the map"
    o.page.mouse.move(xy["x"], xy["y"])
    return o.page.text_content("#tip") or ""


def test_hover_names_the_call_site(browser: Any, pages: dict[str, Path]) -> None:
    """Right after the OOM the mallocs at events 2, 4, 6, 8 are live; their call-sites are i % 3
    for the i-th block (malloc event i + 1): event 2 -> model/b.py:20, event 6 -> model/c.py:30."""
    o = Opened(browser, pages["hand"])
    tip = _hover_block(o, 2)
    assert "call-site: model/b.py:20:activations" in tip and "8.00 MiB rounded" in tip  # the analyzer's label
    assert "at model/b.py:20 in activations" in tip
    assert "malloc: seq 2 at 500.000 ms" in tip and "never freed" in tip
    tip = _hover_block(o, 6)
    assert "call-site: model/c.py:30:temporary" in tip
    o.page.close()


def test_hostile_call_sites_render_as_text(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["hostile"])
    p = o.page
    assert o.errors == []
    assert p.locator("img").count() == 0 and p.locator("#pwn").count() == 0
    assert p.locator("script").count() == 4  # the model and the three inlined scripts, nothing injected
    legend = p.text_content("#legend") or ""
    for s in HOSTILE:  # one-frame call-sites, named as the analyzer names them
        assert s in legend
    tables = p.text_content("#s-tables") or ""
    assert HOSTILE[2] in tables  # the OOM's call-site, as text in its table row
    tip = _hover_block(o, 8)  # block 7: call-site 7 % 3 = 1
    assert "x.py:2 in </style><b id=pwn>bold</b>" in tip
    assert p.locator("#pwn").count() == 0 and p.locator("img").count() == 0
    o.page.close()


def test_zoom_with_keys_and_wheel_and_a_click_on_the_timeline(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["torch-handled-oom"])
    p = o.page
    span = lambda: p.evaluate("tracekit.plot.scales.x.max - tracekit.plot.scales.x.min")  # noqa: E731
    full = span()
    p.keyboard.press("+")
    assert span() < full * 0.7
    p.keyboard.press("0")
    assert span() == pytest.approx(full)
    box = p.locator("#timeline .u-over").bounding_box()
    assert box is not None
    p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    p.mouse.wheel(0, -300)
    assert span() < full
    p.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    seq = int(p.get_attribute("#at", "data-seq") or -1)
    lo, hi = p.evaluate("[tracekit.plot.scales.x.min, tracekit.plot.scales.x.max]")
    assert lo <= seq <= hi  # the clicked event lies in the zoomed range (seq = index in this trace)
    assert o.errors == []
    p.close()


def test_baseline_is_drawn(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["hand"])
    text = o.page.text_content("#s-baseline") or ""
    assert "Against the baseline: base.parquet" in text and "peak live" in text
    assert o.page.locator("#s-baseline canvas").count() >= 1
    o.page.close()


def test_model_strings_match_json(pages: dict[str, Path]) -> None:
    """The page reads the same JSON the tests read (sanity for read_model)."""
    m = read_model(pages["hand"])
    assert json.loads(json.dumps(m)) == m and m["trace"]["name"] == "hand.parquet"
