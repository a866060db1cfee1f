"""The report in a real browser, as ``tracekit analyze --report`` writes it: headless Chromium draws the
page and it is not blank; and the fleet report's figure check can fail.

Skips with a reason where no Chromium binary is installed (Debian: ``apt-get install chromium``). The
page sets ``data-ready="1"`` on its body once drawn; ``--dump-dom`` shows the DOM at that point. The
fleet page records ``data-images="loaded/total"`` on its root element after the load event.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
from test_report import hand_trace

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
CHROMIUM = next((p for p in map(shutil.which, CANDIDATES) if p), None)
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-dev-shm-usage",
)

pytestmark = [pytest.mark.browser, pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium binary found (install the Debian package 'chromium')"
)]


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(CHROMIUM), *FLAGS, f"--user-data-dir={tmp / 'profile'}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tracekit.cli.app import app

    tmp = tmp_path_factory.mktemp("browser")
    trace = hand_trace(tmp / "hand.parquet")
    out = tmp / "report.html"
    r = CliRunner().invoke(app, ["analyze", str(trace), "--report", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_the_analyze_report_is_drawn_in_chromium(report: Path) -> None:
    r = _chromium(["--virtual-time-budget=10000", "--dump-dom", report.resolve().as_uri()], report.parent)
    assert re.search(r'<body[^>]*data-ready="1"', r.stdout), \
        f"the page's script did not finish; chromium said: {r.stderr[-500:]}"
    assert 'id="timeline"' in r.stdout and "uplot" in r.stdout  # the timeline was built


def test_screenshot_is_not_blank(report: Path) -> None:
    from matplotlib.image import imread

    shot = report.parent / "shot.png"
    r = _chromium(
        ["--window-size=1280,2400", "--virtual-time-budget=10000", f"--screenshot={shot}",
         report.resolve().as_uri()], report.parent
    )
    assert shot.is_file(), f"no screenshot; chromium said: {r.stderr[-500:]}"
    img = imread(shot)[..., :3]
    ink = np.mean(np.any(img < 0.9, axis=-1))  # share of pixels that are not (near) white
    assert ink > 0.03, f"only {ink:.1%} of the screenshot has content"
    rgb = (img * 255).astype(np.uint32)
    colours = np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2])
    assert len(colours) > 50  # charts, not text only


def test_a_broken_figure_is_detected(tmp_path: Path) -> None:
    """The fleet page's figure check can fail: a page whose second image is corrupt reports 1 of 2 loaded."""
    from matplotlib.figure import Figure

    from tracekit.report.build import png_bytes
    from tracekit.report.html import Rendered, figure_html, page

    fig = Figure(figsize=(2, 1))
    fig.add_subplot().plot([0, 1])
    png = png_bytes(fig)
    doc = page(
        "broken",
        "",
        [figure_html(Rendered("a", "a", "", png)), figure_html(Rendered("b", "b", "", png[:40]))],
    )
    p = tmp_path / "broken.html"
    p.write_text(doc)
    r = _chromium(["--virtual-time-budget=10000", "--dump-dom", p.resolve().as_uri()], tmp_path)
    assert 'data-images="1/2"' in r.stdout
