"""Every mark of the report page says what it is, on every committed trace, in headless Chromium at 1400×900.

For each trace under ``traces/`` (written with ``advise=True``, so every trace advise can run on has its
answer): the page loads with no console error; the line to paste is visible without scrolling; every series
and mark the timeline draws has its legend entry (``#tl-legend [data-key]``); the fatal OOM's red head is
drawn above the plot, where the selected-event line cannot cover it, and is red on screen; a tooltip never
leaves the window. On chosen traces: handled and fatal heads look different, fragmentation is a muted strip
of its own, device free has its own axis that shows the drop, many OOMs are summarised by call-site, the
request as PyTorch named it, the budget says the pool was capped, plurals, and redraws within 50 ms. Skips
like ``test_page_browser.py`` where Playwright or Chromium is missing.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the browser fixture and page helper
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import test_page_browser as shared
from test_page_model import read_model

from tracekit.report.page import write_page
from tracekit.trace import Events, Op, Source, TraceMeta, write_trace

browser = shared.browser  # the module's one headless Chromium (a fixture)
TRACES = shared.TRACES
COMMITTED = sorted(p.stem for p in TRACES.glob("*.parquet"))
W, H = 1400, 900
MiB, GiB = 1 << 20, 1 << 30
TIMED = """async ([what, arg]) => {
  const T = window.tracekit, frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  await frame();
  const t = performance.now();
  if (what === "zoom") T.zoom(arg[0], arg[1]);
  else if (what === "jump") T.select(arg);
  else if (what === "oom") T.selectOOM(arg);
  await frame();
  return performance.now() - t;
}"""

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(shared.sync_playwright is None or shared.CHROMIUM is None,
                                 reason=f"Playwright or Chromium missing: {shared.INSTALL}")]


def within(box: dict[str, float] | None) -> bool:
    """The box lies inside the 1400×900 window."""
    return box is not None and box["x"] >= 0 and box["y"] >= 0 and box["x"] + box["width"] <= W \
        and box["y"] + box["height"] <= H


class Page:
    """A page opened at 1400×900 from ``file://``, its console errors collected."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.errors: list[str] = []
        self.page = browser.new_page(viewport={"width": W, "height": H})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(path.resolve().as_uri())
        self.page.wait_for_function("window.tracekit && window.tracekit.ready", timeout=30_000)

    def inside(self, selector: str) -> None:
        box = self.page.locator(selector).bounding_box()
        assert box is not None and box["width"] > 0, f"{selector} is not shown"
        assert within(box), box

    def red_pixels(self, x: float, y: float, r: int = 7) -> int:
        """Pixels of the fatal OOM's red within ``r`` css px of (x, y) on screen."""
        from io import BytesIO

        from matplotlib.image import imread

        png = self.page.screenshot(clip={"x": x - r, "y": y - r, "width": 2 * r, "height": 2 * r})
        img = (imread(BytesIO(png))[..., :3] * 255).astype(int)
        return int(np.count_nonzero((img[..., 0] > 170) & (img[..., 1] < 70) & (img[..., 2] < 70)))


def many_oom_trace(path: Path, handled: int = 33) -> Path:
    """``handled`` workspace attempts that fail at three call-sites in turn, each followed by a smaller
    request that succeeds (handled), then a forward pass whose 6 GiB request fails with nothing after it."""
    sites = ("torch/nn/modules/conv.py:456:_conv_forward", "model.py:20:attention", "model.py:30:mlp",
             "model.py:40:forward")
    base = 0x7F00_0000_0000
    rows: list[tuple[int, int, int, int]] = [(Op.SEGMENT_ALLOC, base, 4 * GiB, -1)]
    for i in range(handled):
        a = base + (i % 8) * 64 * MiB
        rows += [(Op.OOM, 0, 8 * GiB + i * MiB, i % 3), (Op.MALLOC, a, 64 * MiB, i % 3),
                 (Op.FREE, a, 64 * MiB, -1)]
    rows += [(Op.OOM, 0, 6 * GiB, 3)]
    op, addr, size, site = (np.array(c) for c in zip(*rows, strict=True))
    ev = Events.build(op.astype(np.int8), size.astype(np.uint64), addr=addr.astype(np.uint64),
                      rounded=size.astype(np.uint64), site=site, sites=sites)
    write_trace(path, TraceMeta.new(Source.TORCH), ev)
    return path


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("marks")
    out = {n: write_page(TRACES / f"{n}.parquet", tmp / f"{n}.html", advise=True) for n in COMMITTED}
    out["many"] = write_page(many_oom_trace(tmp / "many.parquet"), tmp / "many.html")
    return out


def expected_legend(m: dict[str, Any]) -> set[str]:
    """The keys of every series and mark the timeline draws for model ``m``."""
    from test_page_model import ooms

    tl = m["timeline"]
    on = [o for o in ooms(m) if o["index"] >= 0]
    keys = {s["key"] for s in tl["series"]} | {"selected"}
    keys |= {"measured_free"} if tl["measured_free"] else set()
    keys |= {"limit"} if tl["limit_bytes"] else set()
    keys |= {"fatal", "request"} if any(not o["handled"] for o in on) else set()
    keys |= {"handled"} if any(o["handled"] for o in on) else set()
    keys |= {"peak"} if m["peak"]["live_index"] is not None else set()
    return keys


@pytest.mark.parametrize("name", COMMITTED)
def test_every_committed_trace_answers_and_marks_everything(browser: Any, pages: dict[str, Path], name: str
                                                             ) -> None:
    p = Page(browser, pages[name])
    m = read_model(pages[name])
    assert p.errors == [] and p.page.text_content("#status") == ""
    p.inside("#verdict")  # the verdict in one sentence, above the fold, before any chart
    assert p.page.text_content("#verdict") == m["verdict"]["text"] and m["verdict"]["text"].endswith(".")
    chart = p.page.locator("#timeline").bounding_box()
    assert chart is not None
    above = "#answer" if m["answer"] is not None else "#verdict"
    top = p.page.locator(above).bounding_box()
    assert top is not None and top["y"] + top["height"] <= chart["y"], "the answer comes before the chart"
    if m["answer"] is not None:  # the recommendation starts above the fold
        box = p.page.locator("#answer-text").bounding_box()
        assert box is not None and 0 <= box["y"] < H - 40, box
    if m["answer"] is not None and m["answer"]["line"]:  # the line to paste, without scrolling
        assert p.page.is_visible("#answer-line")
        p.inside("#answer-line")
        assert p.page.evaluate("window.scrollY") == 0
    elif m["answer"] is not None:  # nothing to paste: no empty box with a Copy button
        assert not p.page.is_visible("#copy-line") and not p.page.is_visible("#answer-line")
    keys = p.page.evaluate("[...document.querySelectorAll('#tl-legend .litem')].map((e) => e.dataset.key)")
    assert len(keys) == len(set(keys)) and set(keys) == expected_legend(m)
    titles = p.page.evaluate("[...document.querySelectorAll('#tl-legend .litem')].map((e) => e.title)")
    assert all(titles), "every legend entry says what it is on hover"
    fatal = p.page.evaluate("tracekit.fatalMarks()")
    if "fatal" in keys:  # the fatal OOM is selected at load: its head shows above the selected-event line
        assert fatal
        p.page.locator("#timeline").scroll_into_view_if_needed()
        head = p.page.evaluate("tracekit.fatalMarks()")[0]
        over = p.page.locator("#timeline .u-over").bounding_box()
        assert over is not None and head["y"] < over["y"], "above the plot, out of the selected line's reach"
        assert over["x"] - 8 <= head["x"] <= over["x"] + over["width"] + 8
        assert 0 <= head["y"] <= H and p.red_pixels(head["x"], head["y"]) > 20
    else:
        assert fatal == []
    p.page.close()


def _hover_inside(p: Page, x: float, y: float) -> dict[str, float]:
    p.page.mouse.move(x, y)
    assert p.page.is_visible("#tip")
    box = p.page.locator("#tip").bounding_box()
    assert box is not None and within(box), box
    return box


@pytest.mark.parametrize("name", ["torch-handled-oom", "cupy-oom-frag-stacks", "torch-resnet35"])
def test_no_tooltip_leaves_the_window(browser: Any, pages: dict[str, Path], name: str) -> None:
    """The block with the longest tooltip (its whole stack), hovered near the bottom edge, then the block
    at the map's bottom-right end and the timeline's right edge: each tooltip stays inside 1400×900."""
    p = Page(browser, pages[name])
    # Blocks of at least four cells of the map, so the pointer at a block's middle is on that block alone.
    blocks = p.page.evaluate("tracekit.view.blocks.filter((b) => "
                             "tracekit.model.state.blocks.rounded[b] >= 4 * tracekit.view.bpp)")
    lengths = p.page.evaluate("(bs) => bs.map((b) => tracekit.blockTip(b).length)", blocks)
    longest = blocks[int(np.argmax(lengths))]
    assert max(lengths) >= 8, "a block with a stack to show"
    for b in (longest, blocks[-1]):
        p.page.locator("#map").scroll_into_view_if_needed()
        at = p.page.evaluate(f"tracekit.locate({b})")
        assert at is not None
        p.page.mouse.wheel(0, at["y"] - (H - 25))  # the block near the bottom edge of the window
        p.page.wait_for_timeout(50)
        at = p.page.evaluate(f"tracekit.locate({b})")
        assert at is not None and 0 < at["y"] < H
        box = _hover_inside(p, at["x"], at["y"])
        assert box["y"] + box["height"] <= at["y"], "flipped above the pointer"
        shown = p.page.evaluate("document.getElementById('tip').children.length")
        assert shown == p.page.evaluate(f"tracekit.blockTip({b}).length")  # that block's whole tooltip
    p.page.locator("#timeline").scroll_into_view_if_needed()
    over = p.page.locator("#timeline .u-over").bounding_box()
    assert over is not None
    _hover_inside(p, over["x"] + over["width"] - 3, over["y"] + over["height"] - 3)
    p.page.locator("#flame").scroll_into_view_if_needed()
    fl = p.page.locator("#flame").bounding_box()
    assert fl is not None
    p.page.mouse.move(fl["x"] + fl["width"] - 4, fl["y"] + 24)
    if p.page.is_visible("#tip"):
        _hover_inside(p, fl["x"] + fl["width"] - 4, fl["y"] + 24)
    assert p.errors == []
    p.page.close()


def test_handled_and_fatal_marks_look_different(browser: Any, pages: dict[str, Path]) -> None:
    """torch-resnet-fraction: four handled cuDNN OOMs just before the fatal one. Zoomed in, each handled
    head is a grey ring (no red), the fatal head red; the legend names both."""
    p = Page(browser, pages["torch-resnet-fraction"])
    from test_page_model import ooms

    m = read_model(pages["torch-resnet-fraction"])
    first, fatal = ooms(m)[0]["index"], next(o["index"] for o in ooms(m) if not o["handled"])
    p.page.evaluate(f"tracekit.zoom({first - 5}, {fatal + 5})")
    p.page.locator("#timeline").scroll_into_view_if_needed()
    heads, red = p.page.evaluate("tracekit.handledMarks()"), p.page.evaluate("tracekit.fatalMarks()")
    assert len(heads) == 4 and len(red) == 1
    for h in heads:
        assert p.red_pixels(h["x"], h["y"], 4) == 0
    assert p.red_pixels(red[0]["x"], red[0]["y"]) > 20
    legend = p.page.text_content("#tl-legend") or ""
    assert "fatal OOM (the program died of it)" in legend and "handled OOM (the program went on)" in legend
    p.page.close()


def test_fragmentation_is_a_muted_strip_of_its_own(browser: Any, pages: dict[str, Path]) -> None:
    p = Page(browser, pages["torch-handled-oom"])
    main = p.page.evaluate("tracekit.plot.series.map((s) => s.label)")
    assert not any("fragmentation" in (s or "") for s in main)  # not on the memory chart
    assert p.page.is_visible("#frag-strip canvas")
    stroke = p.page.evaluate("tracekit.strip.series[1].stroke()")
    r, g, b = (int(stroke[i:i + 2], 16) for i in (1, 3, 5))
    assert abs(r - g) < 40 and abs(r - b) < 40, f"a muted grey-blue, not the fatal OOM's red: {stroke}"
    assert p.page.evaluate("[tracekit.strip.scales['%'].min, tracekit.strip.scales['%'].max]") == [0, 100]
    assert "external fragmentation (strip below)" in (p.page.text_content("#tl-legend") or "")
    p.page.close()


@pytest.mark.parametrize("name", ["cupy-seed", "cupy-seed-heap"])
def test_device_free_has_its_own_axis_and_the_drop_shows(browser: Any, pages: dict[str, Path], name: str
                                                         ) -> None:
    """The seed's cases: device free measured falls from ~6 GiB to ~0.1 GiB while the pool holds ~2 GiB.
    On its own axis every measured point is inside the range and the drop spans most of the axis."""
    p = Page(browser, pages[name])
    free = p.page.evaluate("Array.from(tracekit.model.timeline.measured_free.bytes)")
    lo, hi = p.page.evaluate("[tracekit.plot.scales.dev.min, tracekit.plot.scales.dev.max]")
    unit = p.page.evaluate("tracekit.devUnit")
    values = [v / unit for v in free]
    assert all(lo <= v <= hi for v in values)
    assert (max(values) - min(values)) / (hi - lo) > 0.6
    assert "device free, measured (right axis)" in (p.page.text_content("#tl-legend") or "")
    p.page.close()


def test_many_ooms_are_summarised(browser: Any, pages: dict[str, Path]) -> None:
    """34 OOMs: the fatal one first, the 33 handled ones as three groups with their counts, on one or two
    rows, not 34 buttons; every one still reachable."""
    p = Page(browser, pages["many"])
    strip = p.page.locator("#oom-strip")
    assert (strip.text_content() or "").startswith("34 OOMs (1 fatal, 33 handled):")
    buttons = strip.locator("button.oom")
    assert buttons.count() == 4
    assert buttons.first.get_attribute("class") == "oom fatal"
    assert [buttons.nth(i).text_content() for i in range(1, 4)] == ["handled ×11"] * 3
    box = strip.bounding_box()
    assert box is not None and box["height"] <= 70, box
    assert "convolution workspace attempts" in (p.page.text_content(".handlers") or "")
    options = p.page.evaluate("[...document.querySelectorAll('#oom-strip select.oom-pick option[value]')]"
                              ".map((o) => Number(o.value))")
    fatal = [int(b.get_attribute("data-oom") or -1) for b in strip.locator("button.oom.fatal").all()]
    assert sorted(options + fatal) == list(range(34))
    p.page.locator("#oom-strip select.oom-pick").nth(1).select_option(index=5)
    assert p.page.get_attribute("#at", "data-seq") is not None
    assert p.errors == []
    p.page.close()


def test_the_request_as_pytorch_said_it(browser: Any, pages: dict[str, Path]) -> None:
    """torch-handled-oom: the trace records a block of 121.50 MiB; PyTorch's error said 122.00 MiB (the
    segment it asked the device for). Both are shown, with why."""
    p = Page(browser, pages["torch-handled-oom"])
    verdict = p.page.text_content("#verdict") or ""
    assert "121.50 MiB requested" in verdict and "Tried to allocate 122.00 MiB" in verdict
    said = p.page.text_content("#request .reported") or ""
    assert "Tried to allocate 122.00 MiB" in said and "rounded up to a segment" in said
    assert "121.50 MiB" in said
    caption = p.page.text_content("#request .request-caption") or ""
    assert "the failing request, 121.50 MiB, at the map's scale" in caption
    assert "pool limit 4.19 GiB" in (p.page.text_content("#tl-legend") or "")
    p.page.close()


def test_the_budget_says_the_pool_was_capped(browser: Any, pages: dict[str, Path]) -> None:
    p = Page(browser, pages["torch-handled-oom"])
    text = p.page.text_content("#budget") or ""
    assert "pool capped at 4.19 GiB" in text and "134.96 GiB free at the OOM" in text
    assert p.page.locator("#budget .bcap").count() == 1
    assert "cap 4.19 GiB" in (p.page.text_content("#budget .bcap") or "")
    p.page.close()


def test_counts_are_said_in_their_number(browser: Any, pages: dict[str, Path]) -> None:
    p = Page(browser, pages["cupy-seed"])
    assert (p.page.text_content("#oom-strip .oom-count") or "") == "1 OOM:"
    facts = p.page.text_content("#facts") or ""
    assert "1 OOM, 0 handled" in facts and "1 OOMs" not in facts and "in 6 blocks" in facts
    p.page.close()


@pytest.mark.parametrize("name", ["torch-handled-oom", "torch-gpt2-lengths", "cupy-mlp"])
def test_redraws_within_50_ms(browser: Any, pages: dict[str, Path], name: str) -> None:
    """Zooms (random ranges: levels of detail change), jumps to random events and clicks on each OOM: the
    median of each within 50 ms (the issue's target), each within 1 s on this shared machine (one jump of
    a parallel test run once took over 200 ms where its eleven others took 17 ms: a stall of the
    machine, not of the page; the median is the measure, ``scripts/bench_page.py`` the figures)."""
    import random

    rng = random.Random(0)
    p = Page(browser, pages[name])
    n = p.page.evaluate("tracekit.model.timeline.n")
    # Untimed once each first: the first zoom of a page (its code compiled, its first level of detail
    # built) took 272 ms once under a parallel test run, every later one 11-17 ms.
    p.page.evaluate(TIMED, ["zoom", [0, max(2, n // 2)]])
    p.page.evaluate(TIMED, ["jump", 0])
    zooms, jumps = [], []
    for _ in range(12):
        a = rng.randrange(0, max(n - 2, 1))
        span = max(2, int(n * 10 ** rng.uniform(-3, 0)))
        zooms.append(p.page.evaluate(TIMED, ["zoom", [a, min(n, a + span)]]))
        jumps.append(p.page.evaluate(TIMED, ["jump", rng.randrange(n)]))
    count = p.page.evaluate("tracekit.model.ooms.count")
    if count:
        p.page.evaluate(TIMED, ["oom", count - 1])  # untimed, as above
    ooms = [p.page.evaluate(TIMED, ["oom", i]) for i in range(min(count, 8))]
    for what, ms in (("zoom", zooms), ("jump", jumps), ("oom", ooms)):
        if ms:
            assert statistics.median(ms) <= 50 and max(ms) <= 1000, (what, ms)
    assert p.errors == []
    p.page.close()


def test_the_answer_says_how_it_was_checked_and_lists_the_cures(browser: Any, pages: dict[str, Path]) -> None:
    """cupy-seed: the device ran out. Under the line: the three checks (the replay done, the device and a real
    run not, each naming the option that would), then the cures, the recommended one first, each with what it
    gives back and its line."""
    p = Page(browser, pages["cupy-seed"])
    m = read_model(pages["cupy-seed"])
    hows = p.page.evaluate("[...document.querySelectorAll('#answer-checks .check')]"
                           ".map((e) => [e.dataset.how, e.classList.contains('done')])")
    assert hows == [["replay", True], ["device", False], ["real run", False]]
    checks = p.page.text_content("#answer-checks") or ""
    assert "--verify-on-device" in checks and "--rerun 1" in checks
    assert p.page.is_visible("#answer-cures")
    items = p.page.locator("#answer-cures li.cure")
    assert items.count() == len(m["answer"]["cures"]) >= 2
    first = items.first
    assert first.get_attribute("class") == "cure chosen" and "recommended" in (first.text_content() or "")
    assert (first.locator("code").text_content() or "") == m["answer"]["line"]
    assert "gives back 3.87 GiB (measured)" in (first.text_content() or "")
    line = p.page.locator("#answer-line").bounding_box()
    cures = p.page.locator("#answer-cures").bounding_box()
    assert line is not None and cures is not None and line["y"] < cures["y"], "the line, then the cures"
    assert p.errors == []
    p.page.close()
    p = Page(browser, pages["torch-oom"])  # a pool limit ran out: a setting is the answer, no cures
    assert not p.page.is_visible("#answer-cures") and p.page.locator("#answer-checks .check").count() == 3
    p.page.close()
