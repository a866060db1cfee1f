"""The flame graph of the report page in a real browser (Playwright, headless Chromium).

The stacks trace of ``tests/unit/test_page_model.py`` (whole call stacks, blocks of 4 to 12 MiB, a fatal
16 MiB request at the end) has worked flame graphs at the OOM and at the peak (``FLAME_AT_OOM``,
``FLAME_AT_PEAK``: MiB held by each path, root first); the page's nodes, their bytes and their drawn widths
are checked against them. Skips like ``test_page_browser.py`` where Playwright or Chromium is missing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the browser fixture and page helper
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))  # shared hand-built traces
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
import test_page_browser as shared
from test_page_model import (
    ALL,
    BIDI,
    BIDI_FRAMES,
    C10,
    CALL,
    CONV,
    COPY,
    CUPY_FRAMES,
    FLAME_AT_OOM,
    FLAME_AT_PEAK,
    FRAMES,
    FWD,
    MAIN,
    STEP,
    stacks_trace,
)

from tracekit.report.page import write_page
from tracekit.trace.stacks import FrameKind

Opened = shared.Opened
browser = shared.browser  # the module's one headless Chromium (a fixture)

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(shared.sync_playwright is None or shared.CHROMIUM is None,
                                 reason=f"Playwright or Chromium missing: {shared.INSTALL}")]

MiB = 1 << 20
NATIVE = "C++ (native)"
HOSTILE_FRAMES = (
    ("evil/<script>alert(1)</script>.py", 100, "main", FrameKind.USER),
    ("train.py", 88, "</style><b id=pwn>bold</b>", FrameKind.USER),
    *FRAMES[2:6],
    ("/usr/lib/python3.12/copy.py", 10, '"><img src=x onerror=alert(1)>', FrameKind.STDLIB),
)
# The drawn nodes as paths of names: a node's name is its frame's function, "all" for the root.
PATHS = """() => {
  const F = tracekit.model.frames, v = tracekit.flame.view, by = new Map(v.nodes.map((n) => [n.node, n]));
  const name = (n) => n.frame >= 0 ? F.function[n.frame] : n.frame === -3 ? "all" : n.label;
  return v.nodes.map((n) => {
    const path = [];
    for (let u = n; u; u = by.get(u.parent)) path.unshift(name(u));
    return [path, n.bytes, n.w, n.req, n.node];
  });
}"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("flame")
    return {
        "stacks": write_page(stacks_trace(tmp / "s.parquet"), tmp / "s.html"),
        "hostile": write_page(stacks_trace(tmp / "h.parquet", HOSTILE_FRAMES), tmp / "h.html"),
        "cupy": write_page(stacks_trace(tmp / "c.parquet", CUPY_FRAMES), tmp / "c.html"),
        "bidi": write_page(stacks_trace(tmp / "b.parquet", BIDI_FRAMES), tmp / "b.html"),
    }


def drawn(o: Opened) -> dict[tuple[str, ...], tuple[float, float, bool, int]]:
    """Each drawn node by its path: (MiB, width in px, on the failing request's stack, node id)."""
    return {tuple(p): (b / MiB, w, r, n) for p, b, w, r, n in o.page.evaluate(PATHS)}


def show_native(o: Opened) -> None:
    o.page.check(".fl-native input")


def test_at_the_fatal_oom_the_worked_flame_graph(browser: Any, pages: dict[str, Path]) -> None:
    """The page opens at the fatal OOM: with C++ frames shown every path holds the worked MiB, each node
    is drawn as wide as its bytes (the root full width), the failing request's path is outlined."""
    o = Opened(browser, pages["stacks"])
    p = o.page
    assert "fatal OOM" in (p.text_content(".fl-title") or "")
    folded = drawn(o)
    assert folded[(ALL, MAIN, STEP, CALL, FWD, CONV, NATIVE)][0] == 12  # the C++ run, one node
    assert all(C10 not in path for path in folded)
    show_native(o)
    nodes = drawn(o)
    assert {path: v[0] for path, v in nodes.items()} == FLAME_AT_OOM
    full = nodes[(ALL,)][1]
    for path, (mib, width, _, _) in nodes.items():
        assert width == pytest.approx(full * mib / 36, abs=0.01), path
    # Drawn on the screen at those widths too (CSS pixels, one pixel of rounding).
    for path in ((ALL, MAIN, STEP, CALL), (ALL, MAIN, STEP, COPY)):
        box = p.evaluate(f"tracekit.flame.locate({nodes[path][3]})")
        assert box["width"] == pytest.approx(full * nodes[path][0] / 36, abs=1.0)
    outlined = {path for path, v in nodes.items() if v[2]}
    assert outlined == {(ALL, MAIN), (ALL, MAIN, STEP), (ALL, MAIN, STEP, CALL), (ALL, MAIN, STEP, CALL, FWD),
                        (ALL, MAIN, STEP, CALL, FWD, CONV), (ALL, MAIN, STEP, CALL, FWD, CONV, C10)}
    assert sum(p.evaluate("tracekit.flame.view.nodes.map((n) => n.req)")) == 6
    note = p.text_content(".fl-note") or ""
    assert "Fatal OOM" in note and "16.00 MiB" in note and "main (train.py:100) → step (train.py:88)" in note
    assert o.errors == []
    p.close()


def test_peak_and_never_freed_buttons_and_keys(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["stacks"])
    p = o.page
    show_native(o)
    p.click("button.fl-peak")
    assert {path: v[0] for path, v in drawn(o).items()} == FLAME_AT_PEAK
    assert p.get_attribute("#at", "data-seq") == "8" and "peak" in (p.text_content(".fl-title") or "")
    assert not any(p.evaluate("tracekit.flame.view.nodes.map((n) => n.req)"))
    p.click("button.fl-end")
    assert {path: v[0] for path, v in drawn(o).items()} == FLAME_AT_OOM  # never freed = live at the end
    assert p.get_attribute("#at", "data-seq") == "13"
    p.keyboard.press("p")
    assert drawn(o)[(ALL,)][0] == 64
    p.keyboard.press("f")
    assert drawn(o)[(ALL,)][0] == 36 and sum(v[2] for v in drawn(o).values()) == 6
    p.keyboard.press("p")
    p.click("button.fl-fatal")
    assert p.get_attribute("#at", "data-seq") == "13"
    p.keyboard.press("p")
    p.select_option("select.fl-ooms", "0")
    assert p.get_attribute("#at", "data-seq") == "13"
    assert o.errors == []
    p.close()


def test_click_zooms_in_and_out(browser: Any, pages: dict[str, Path]) -> None:
    """A click on forward (16 of 36 MiB) draws it full width with conv (16) full width below and the C++
    node at 12/16; its ancestors stay on top; a click on it again zooms out to its caller, on the root
    to the whole graph."""
    o = Opened(browser, pages["stacks"])
    p = o.page
    nodes = drawn(o)
    full = nodes[(ALL,)][1]
    fwd = nodes[(ALL, MAIN, STEP, CALL, FWD)][3]
    xy = p.evaluate(f"tracekit.flame.locate({fwd})")
    p.mouse.click(xy["x"], xy["y"])
    assert p.evaluate("tracekit.flame.view.focus") == fwd
    zoomed = drawn(o)
    assert zoomed[(ALL, MAIN, STEP, CALL, FWD)][1] == pytest.approx(full)
    assert zoomed[(ALL, MAIN, STEP, CALL, FWD, CONV)][1] == pytest.approx(full)
    assert zoomed[(ALL, MAIN, STEP, CALL, FWD, CONV, NATIVE)][1] == pytest.approx(full * 12 / 16)
    assert (ALL, MAIN, STEP, COPY) not in zoomed and (ALL, MAIN, STEP) in zoomed
    assert "zoomed into forward" in (p.text_content(".fl-title") or "")
    p.keyboard.press("p")  # another event: the zoom stays on forward (36 MiB of 64 there)
    assert p.evaluate("tracekit.flame.view.focus") == fwd
    assert drawn(o)[(ALL, MAIN, STEP, CALL, FWD, CONV)][1] == pytest.approx(full * 28 / 36)
    xy = p.evaluate(f"tracekit.flame.locate({fwd})")
    p.mouse.click(xy["x"], xy["y"])  # the focus again: out to its caller
    assert p.evaluate("tracekit.flame.view.focus") == nodes[(ALL, MAIN, STEP, CALL)][3]
    xy = p.evaluate("tracekit.flame.locate(0)")
    p.mouse.click(xy["x"], xy["y"])
    assert p.evaluate("tracekit.flame.view.focus") == 0
    assert drawn(o)[(ALL, MAIN, STEP, COPY)][1] == pytest.approx(full * 20 / 64)
    assert o.errors == []
    p.close()


def test_hover_names_the_frame(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["stacks"])
    p = o.page
    nodes = drawn(o)
    p.locator("#flame").scroll_into_view_if_needed()
    xy = p.evaluate(f"tracekit.flame.locate({nodes[(ALL, MAIN, STEP, COPY)][3]})")
    p.mouse.move(xy["x"], xy["y"])
    tip = p.text_content("#tip") or ""
    assert "deepcopy" in tip and "/usr/lib/python3.12/copy.py:10" in tip and "stdlib frame" in tip
    assert "12.00 MiB (12,582,912 B) in 1 blocks" in tip and "33.3% of the live bytes" in tip
    assert "your code" not in tip
    xy = p.evaluate(f"tracekit.flame.locate({nodes[(ALL, MAIN, STEP)][3]})")
    p.mouse.move(xy["x"], xy["y"])
    tip = p.text_content("#tip") or ""
    assert "step" in tip and "train.py:88" in tip and "your code" in tip and "100.0%" in tip
    assert "8.00 MiB allocated here" in tip and "on the failing request's stack" in tip
    mine = p.evaluate("tracekit.flame.view.nodes.filter((n) => n.mine).map((n) => n.text)")
    assert mine == ["main (train.py:100)", "step (train.py:88)", "forward (model.py:30)"]  # marked, labelled
    assert o.errors == []
    p.close()


def test_a_stand_in_cupy_frame_is_not_marked_as_the_users(browser: Any, pages: dict[str, Path]) -> None:
    """CuPy's stand-in (tests/fakecupy) and a CuPy checkout, frames of kind user outside site-packages: drawn,
    labelled and hovered as library code, not the user's; the user's own frames stay marked."""
    o = Opened(browser, pages["cupy"])
    p = o.page
    mine = p.evaluate("tracekit.flame.view.nodes.filter((n) => n.mine).map((n) => n.text)")
    assert mine == ["main (train.py:100)", "step (train.py:88)", "forward (model.py:30)"]
    nodes = drawn(o)
    p.locator("#flame").scroll_into_view_if_needed()
    xy = p.evaluate(f"tracekit.flame.locate({nodes[(ALL, MAIN, STEP, 'solve')][3]})")
    p.mouse.move(xy["x"], xy["y"])
    tip = p.text_content("#tip") or ""
    assert "fakecupy/cupy/linalg.py:40" in tip and "your code" not in tip
    marked = p.evaluate("[...document.querySelectorAll('.fl-note .mine-text')].map((e) => e.textContent)")
    assert marked == ["main (train.py:100)", "step (train.py:88)", "forward (model.py:30)"]
    assert o.errors == []
    p.close()


def test_a_bidi_override_in_a_frame_name_shows_escaped(browser: Any, pages: dict[str, Path]) -> None:
    """A frame named with U+202E (and a file with U+2066): the failing request's sentence, the flame
    graph's labels and its hover, the legend and the tables show ``\\u202e`` as text; no format character
    reaches the page, so nothing displays reversed."""
    o = Opened(browser, pages["bidi"])
    p = o.page
    shown = "evil\\u202eyp.niam"
    assert shown != BIDI and "\u202e" in BIDI
    note = p.text_content(".fl-note") or ""
    assert f"{shown} (train.py:88)" in note and "(mod\\u2066el.py:30)" in note
    assert f"{shown} (train.py:88)" in p.evaluate("tracekit.flame.view.nodes.map((n) => n.text)")
    nodes = drawn(o)
    p.locator("#flame").scroll_into_view_if_needed()
    xy = p.evaluate(f"tracekit.flame.locate({nodes[(ALL, MAIN, shown)][3]})")
    p.mouse.move(xy["x"], xy["y"])
    assert shown in (p.text_content("#tip") or "")
    assert "train.py:88:" + shown in (p.text_content("#legend") or "")
    everything = p.evaluate("document.body.innerText + "
                            "tracekit.flame.view.nodes.map((n) => n.text + n.label).join()")
    assert shown in everything and not any(c in everything for c in "\u202e\u2066\u202a\u200f")
    assert o.errors == []
    p.close()


def test_hostile_frame_names_render_as_text(browser: Any, pages: dict[str, Path]) -> None:
    o = Opened(browser, pages["hostile"])
    p = o.page
    show_native(o)
    assert o.errors == []
    assert p.locator("img").count() == 0 and p.locator("#pwn").count() == 0
    labels = p.evaluate("tracekit.flame.view.nodes.map((n) => n.text)")  # as drawn, canvas text
    assert "</style><b id=pwn>bold</b> (train.py:88)" in labels
    assert '"><img src=x onerror=alert(1)> (copy.py:10)' in labels
    nodes = {tuple(path): n for path, _, _, _, n in p.evaluate(PATHS)}
    xy = p.evaluate(f"tracekit.flame.locate({nodes[('all', 'main')]})")
    p.mouse.move(xy["x"], xy["y"])
    assert "evil/<script>alert(1)</script>.py:100" in (p.text_content("#tip") or "")
    note = p.text_content(".fl-note") or ""
    assert "</style><b id=pwn>bold</b> (train.py:88)" in note
    assert p.locator("#pwn").count() == 0 and p.locator("img").count() == 0
    assert p.locator("script").count() == 4
    p.close()


TRACES = Path(__file__).resolve().parents[2] / "traces"


OUTLINED = """(s) => {
  const fl = tracekit.flame, t = fl.tree(), drawn = fl.view.nodes, path = new Set();
  for (let v = s >= 0 ? fl.nodeOfStack(s) : 0; v > 0; v = t.parent[v]) path.add(v);
  const ids = (keep) => drawn.filter(keep).map((n) => n.node).sort();
  return [ids((n) => n.req), ids((n) => path.has(n.node))];
}"""


def outlined(p: Any, stack: int) -> int:
    """How many drawn nodes are outlined as the failing request's; asserts they are exactly the drawn nodes
    on the path of its stack (the root excluded), through the page's own tree of paths."""
    req, path = p.evaluate(OUTLINED, stack)
    assert req == path
    return len(req)


def test_each_oom_handled_or_fatal_holds_the_analyzers_live_bytes(browser: Any, tmp_path: Path) -> None:
    """On a real recording with handled OOMs and a fatal one: the list names each OOM handled or FATAL,
    choosing one selects it, ``]`` steps to the next; at each the flame graph's root holds exactly the
    analyzer's live bytes at that OOM."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
    from test_page_model import ooms, read_model

    page_path = write_page(TRACES / "torch-handled-oom.parquet", tmp_path / "t.html")
    m = ooms(read_model(page_path))
    assert any(x["handled"] for x in m) and not all(x["handled"] for x in m)
    o = Opened(browser, page_path)
    p = o.page
    options = p.evaluate("Array.from(document.querySelectorAll('select.fl-ooms option'))"
                         ".slice(1).map((e) => e.textContent)")
    assert [t.split(" seq ")[0] for t in options] == ["handled" if x["handled"] else "FATAL" for x in m]
    for x in m:
        p.select_option("select.fl-ooms", str(x["id"]))
        assert p.get_attribute("#at", "data-seq") == str(x["seq"])
        assert p.evaluate("tracekit.flame.view.total") == x["live_bytes"]
        title = p.text_content(".fl-title") or ""
        assert ("handled OOM" if x["handled"] else "fatal OOM") in title
        assert outlined(p, x["stack"]) if x["stack"] >= 0 else not outlined(p, -1)
    p.select_option("select.fl-ooms", "0")
    p.keyboard.press("]")
    assert p.get_attribute("#at", "data-seq") == str(m[1]["seq"])
    p.keyboard.press("[")
    assert p.get_attribute("#at", "data-seq") == str(m[0]["seq"])
    assert o.errors == []
    p.close()


def test_deep_random_stacks_roll_up_as_the_analyzer_s_blocks(browser: Any, tmp_path: Path) -> None:
    """A synthetic trace given 400 random stacks (depth up to 30, a quarter of the frames C++): at several
    events every drawn node holds the bytes of the analyzer's live blocks (``pool_state_at``) whose stack
    path starts with the node's path, summed here by walking each block's stack."""
    import dataclasses

    import numpy as np

    from tracekit.analysis.leaks import pool_state_at
    from tracekit.synth import Pattern, synthesize
    from tracekit.trace import Op, read_trace, write_trace
    from tracekit.trace.stacks import StackTable

    rng = np.random.default_rng(7)
    synthesize(Pattern("fragmenting"), 20_000, 0, tmp_path / "s.parquet")
    t = read_trace(tmp_path / "s.parquet")
    n, nf = 400, 300
    parent, depth = [-1], [1]
    for s in range(1, n):  # a parent among the earlier stacks, keeping the depth at most 30
        q = int(rng.integers(-1, s))
        q = q if q < 0 or depth[q] < 30 else -1
        parent.append(q)
        depth.append(1 if q < 0 else depth[q] + 1)
    kind = rng.choice([0, 1, 2, 3], nf, p=[0.3, 0.35, 0.1, 0.25]).tolist()
    table = StackTable.build([f"m/f{i}.py" for i in range(nf)], list(range(nf)),
                             [f"fn{i}" for i in range(nf)], kind, rng.integers(0, nf, n).tolist(), parent)
    ev = t.events
    stack = np.where(ev.op == Op.MALLOC, rng.integers(-1, n, len(ev)), -1).astype(np.int32)
    write_trace(tmp_path / "d.parquet", t.meta, dataclasses.replace(ev, stack=stack, stacks=table))
    trace = read_trace(tmp_path / "d.parquet")
    page_path = write_page(tmp_path / "d.parquet", tmp_path / "d.html")
    o = Opened(browser, page_path)
    show_native(o)
    paths = """() => { const v = tracekit.flame.view, by = new Map(v.nodes.map((n) => [n.node, n]));
      return v.nodes.map((n) => {
        const p = []; for (let u = n; u && u.node; u = by.get(u.parent)) p.unshift(u.frame);
        return [p, n.bytes]; }); }"""
    for k in (len(ev) // 5, len(ev) // 2, len(ev) - 1):
        o.page.evaluate(f"tracekit.select({k})")
        live = pool_state_at(trace.events, trace.mate, k + 1).block_index
        want: dict[tuple[int, ...], int] = {(): 0}
        for b in live.tolist():
            frames = list(trace.events.stacks.walk(int(trace.events.stack[b])))[::-1]
            path = tuple(frames) if trace.events.stack[b] >= 0 else (-4,)
            for i in range(len(path) + 1):
                want[path[:i]] = want.get(path[:i], 0) + int(trace.events.rounded[b])
        got = {tuple(p): b for p, b in o.page.evaluate(paths)}
        assert len(got) > 20
        for path, b in got.items():
            assert b == want[path], (k, path)
    assert o.errors == []
    o.page.close()


def test_the_keyboard_walks_the_frames_and_zooms(browser: Any, pages: dict[str, Path]) -> None:
    """Tab reaches the graph; the cursor starts at the root, Down goes to the widest callee, Right to
    its neighbour, Up to the caller; each move says the frame in words (a live region); Enter zooms
    as a click does, and zooms out on the focus again."""
    o = Opened(browser, pages["stacks"])
    p = o.page
    nodes = drawn(o)
    p.focus("#flame")
    assert p.evaluate("document.activeElement.id") == "flame" and p.get_attribute("#flame", "tabindex") == "0"
    assert p.evaluate("tracekit.flame.cursor()") == 0
    assert "all live blocks" in (p.text_content(".fl-said") or "")
    p.keyboard.press("ArrowDown")
    assert p.evaluate("tracekit.flame.cursor()") == nodes[(ALL, MAIN)][3]
    for _ in range(2):
        p.keyboard.press("ArrowDown")
    step_ = nodes[(ALL, MAIN, STEP)][3]
    widest = nodes[(ALL, MAIN, STEP, CALL)][3]  # 16 MiB against copy's 12
    assert p.evaluate("tracekit.flame.cursor()") == widest
    p.keyboard.press("ArrowRight")
    assert p.evaluate("tracekit.flame.cursor()") == nodes[(ALL, MAIN, STEP, COPY)][3]
    said = p.text_content(".fl-said") or ""
    assert "deepcopy" in said and "12.00 MiB" in said and p.get_attribute(".fl-said", "aria-live") == "polite"
    p.keyboard.press("ArrowRight")  # the end of the row: stays
    assert p.evaluate("tracekit.flame.cursor()") == nodes[(ALL, MAIN, STEP, COPY)][3]
    p.keyboard.press("ArrowLeft")
    p.keyboard.press("Enter")
    assert p.evaluate("tracekit.flame.view.focus") == widest
    assert drawn(o)[(ALL, MAIN, STEP, CALL)][1] == pytest.approx(nodes[(ALL,)][1])
    p.keyboard.press("Enter")  # on the focus: out to its caller
    assert p.evaluate("tracekit.flame.view.focus") == step_
    p.keyboard.press("ArrowUp")
    assert p.evaluate("tracekit.flame.cursor()") == step_
    p.keyboard.press("Tab")  # away: nothing said, the cursor no longer drawn
    assert p.evaluate("document.activeElement.id") != "flame" and (p.text_content(".fl-said") or "") == ""
    assert o.errors == []
    p.close()
