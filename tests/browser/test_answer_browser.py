"""The page answers first: the recommendation and the line to paste above the fold at 1400×900.

Needs the ``playwright`` Python package (tracekit's dev extra) and Debian's ``chromium``
(``apt-get install chromium``); skipped, saying so, where either is missing. The pages are written by
``write_page(..., advise=True)`` on committed traces; the answer is advise's own (one verdict).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tracekit.report.page import write_page

CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
INSTALL = ("install the Python package with `pip install playwright` (it is in tracekit's dev extra) and "
           "Debian's browser with `apt-get install chromium`; `playwright install` is not needed")
TRACES = Path(__file__).resolve().parents[2] / "traces"
CASES = {"torch-oom": "fits", "torch-handled-oom": "borderline", "cupy-oom-frag": "fits"}

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(sync_playwright is None or CHROMIUM is None,
                                 reason=f"Playwright or Chromium missing: {INSTALL}")]


@pytest.fixture(scope="module")
def debian_chromium() -> Iterator[Any]:
    assert sync_playwright is not None
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("answer")
    return {n: write_page(TRACES / f"{n}.parquet", tmp / f"{n}.html", advise=True) for n in CASES}


@pytest.mark.parametrize("name", list(CASES))
def test_the_answer_is_above_the_fold(debian_chromium: Any, pages: dict[str, Path], name: str) -> None:
    page = debian_chromium.new_page(viewport={"width": 1400, "height": 900})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(pages[name].resolve().as_uri())
    page.wait_for_function("window.tracekit && window.tracekit.ready", timeout=30_000)
    assert errors == []
    assert page.is_visible("#answer")
    line = page.text_content("#answer-line") or ""
    box = page.locator("#answer-line").bounding_box()
    assert box is not None and box["y"] + box["height"] <= 900, box  # no scrolling needed
    text = page.text_content("#answer-text") or ""
    margin = page.text_content("#answer-margin") or ""
    if CASES[name] == "fits":
        assert line and line in text and ": fits" in margin and "margin" in margin
    else:  # the ResNet-50 run with cuDNN fallbacks: nothing is called a fit, the best is borderline
        assert text.startswith("Nothing tried fits") and ": borderline" in margin and ": fits" not in margin
    page.click("#copy-line")
    said = ""
    for _ in range(100):  # polled from here: the page's CSP forbids evaluating a string predicate
        said = page.text_content("#copied") or ""
        if said:
            break
        page.wait_for_timeout(50)
    assert said in ("copied", "selected: press Ctrl+C")
    if said != "copied":
        assert page.evaluate("window.getSelection().toString()") == line
    # each of these runs died: the commands that get the whole run's answer, with their own copy button
    whole = page.text_content("#whole-lines") or ""
    assert page.is_visible("#whole") and whole.startswith("tracekit record ")
    assert f"\ntracekit advise {name}-whole.parquet --limit " in whole
    page.click("#copy-whole")
    said = ""
    for _ in range(100):
        said = page.text_content("#copied-whole") or ""
        if said:
            break
        page.wait_for_timeout(50)
    assert said in ("copied", "selected: press Ctrl+C")
    page.close()


def test_a_run_that_completed_gets_no_whole_run_commands(debian_chromium: Any, tmp_path: Path) -> None:
    out = write_page(TRACES / "torch-expandable.parquet", tmp_path / "p.html", advise=True)
    page = debian_chromium.new_page(viewport={"width": 1400, "height": 900})
    page.goto(out.resolve().as_uri())
    page.wait_for_function("window.tracekit && window.tracekit.ready", timeout=30_000)
    assert page.is_visible("#answer") and not page.is_visible("#whole")
    page.close()
