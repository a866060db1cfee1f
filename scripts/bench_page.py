"""Benchmark the browser report on a large trace: write time against the matplotlib report, page size,
time to interactive and redraw times in headless Chromium.

Usage: ``python3 scripts/bench_page.py [--events 10000000] [--pattern fragmenting] [--trace PATH]
[--keep DIR] [--skip-old] [--repeat 20] [--stacks 3000]``.

1. Writes the trace (``tracekit synth``, its requests at ``--stacks`` distinct whole call stacks of depth
   8..39) unless ``--trace`` or it exists in ``--keep``.
2. Times ``tracekit report`` (the page) and the matplotlib figures (``tracekit.report.build.build_figures``:
   what ``report --png`` and ``fleet`` draw, the old matplotlib report's work), each in a fresh process, one
   after the other, after a warm-up run of each on a small trace.
3. Opens the page from ``file://`` in headless Chromium (Playwright, ``/usr/bin/chromium``) and
   reads ``performance.now()`` when the page is ready (since navigation start: interactive), then
   times, inside the page, each redraw up to the next animation frame: a zoom (random ranges, so
   levels of detail change), a scrub step (the next kept event), a jump to a random event, and a
   click on an OOM (every OOM if there are few, else a random sample); and in the flame graph at the peak
   (with its C++ frames shown) a click zooming into a random drawn node and one zooming back out.

Targets (issue: the report in the browser): at most 25 MB; written in at most 2x the matplotlib
figures' time; interactive within 3 s; each redraw within 50 ms (issue 40; 100 ms before).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tracekit.synth.stacks import DEFAULT_STACKS

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
OLD = ("import sys; from pathlib import Path; from tracekit.report.build import build_figures; "
       "from tracekit.trace import read_trace; "
       "build_figures(read_trace(sys.argv[1]), None, Path(sys.argv[1]).name)")
TIMED = """async ([what, arg]) => {
  const T = window.tracekit, frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  await frame();
  const t = performance.now();
  if (what === "zoom") T.zoom(arg[0], arg[1]);
  else if (what === "step") T.step(1);
  else if (what === "jump") T.select(arg);
  else if (what === "oom") T.selectOOM(arg);
  else if (what === "flame") T.flame.zoom(arg);
  await frame();
  return performance.now() - t;
}"""


def run(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t


def write_times(trace: Path, folder: Path, skip_old: bool) -> tuple[float, float | None, Path]:
    """(page seconds, matplotlib figures' seconds or None, page path), each after a warm-up."""
    from tracekit.synth import Pattern, synthesize

    small = folder / "warm.parquet"
    if not small.exists():
        synthesize(Pattern("fragmenting"), 20_000, 0, small)
    exe = [sys.executable, "-m", "tracekit"]
    out = folder / (trace.stem + ".page.html")
    run([*exe, "report", str(small), "-o", str(folder / "warm.html"), "--force"])
    new = run([*exe, "report", str(trace), "-o", str(out), "--force"])
    old = None
    if not skip_old:
        run([sys.executable, "-c", OLD, str(small), str(folder / "warm-old.html")])
        old = run([sys.executable, "-c", OLD, str(trace), str(folder / (trace.stem + ".old.html"))])
    return new, old, out


def browser_times(page_path: Path, repeat: int) -> dict[str, Any]:
    import random

    from playwright.sync_api import sync_playwright

    rng = random.Random(0)
    out: dict[str, Any] = {}
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        page = b.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        t = time.perf_counter()
        page.goto(page_path.resolve().as_uri())
        page.wait_for_function("window.tracekit && window.tracekit.ready", timeout=60_000, polling=20)
        out["open_to_ready_s"] = time.perf_counter() - t
        out["interactive_ms"] = page.evaluate("tracekit.readyAt")
        n = page.evaluate("tracekit.model.timeline.n")
        zooms = []
        for _ in range(repeat):
            a = rng.randrange(0, max(n - 2, 1))
            span = max(2, int(n * 10 ** rng.uniform(-5, 0)))
            zooms.append(page.evaluate(TIMED, ["zoom", [a, min(n, a + span)]]))
        page.evaluate(TIMED, ["zoom", [0, n]])
        steps = [page.evaluate(TIMED, ["step", 0]) for _ in range(repeat)]
        jumps = [page.evaluate(TIMED, ["jump", rng.randrange(n)]) for _ in range(repeat)]
        count = page.evaluate("tracekit.model.ooms.count")
        ids = list(range(count)) if count <= repeat else rng.sample(range(count), repeat)
        ooms = [page.evaluate(TIMED, ["oom", i]) for i in ids]
        if page.locator(".fl-native input").count():
            page.check(".fl-native input")
        page.evaluate("tracekit.select(tracekit.model.peak.live_index)")
        flame = []
        for _ in range(repeat):
            nodes = page.evaluate("tracekit.flame.view.nodes.map((n) => n.node)")
            flame.append(page.evaluate(TIMED, ["flame", nodes[rng.randrange(len(nodes))]]))
            flame.append(page.evaluate(TIMED, ["flame", 0]))
        out.update(zoom=zooms, step=steps, jump=jumps, oom=ooms, flame=flame, errors=errors, events=n,
                   ooms=count, note=page.evaluate("tracekit.model.state.note"),
                   drawn=page.evaluate("tracekit.flame.view.nodes.length"),
                   stacks=page.evaluate("tracekit.model.stacks.frame.length"))
        b.close()
    return out


def line(name: str, ms: list[float]) -> str:
    if not ms:
        return f"{name:<10} (none)"
    return (f"{name:<10} median {statistics.median(ms):6.1f} ms  max {max(ms):6.1f} ms  "
            f"({len(ms)} runs; target 50 ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000)
    ap.add_argument("--pattern", default="fragmenting")
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--keep", type=Path, default=None)
    ap.add_argument("--skip-old", action="store_true", help="do not time the matplotlib figures")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--stacks", type=int, default=DEFAULT_STACKS, help="distinct call stacks of the trace")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="tracekit-bench-page-"))
    folder.mkdir(parents=True, exist_ok=True)
    trace = args.trace or folder / f"{args.pattern}-{args.events}-stacks{args.stacks}.parquet"
    if not trace.exists():
        from tracekit.synth import Pattern, synthesize

        synthesize(Pattern(args.pattern), args.events, 0, trace, stacks=args.stacks)
    new, old, page = write_times(trace, folder, args.skip_old)
    size = page.stat().st_size
    print(f"trace      {trace}")
    print(f"page       {new:7.2f} s  {size / 1e6:6.2f} MB (target 25 MB)")
    if old is not None:
        print(f"matplotlib {old:7.2f} s  (page / matplotlib = {new / old:.2f}; target <= 2)")
    r = browser_times(page, args.repeat)
    print(f"browser    ready {r['interactive_ms']:.0f} ms after navigation start (target 3000 ms); "
          f"{r['open_to_ready_s']:.2f} s from goto; {r['events']:,} events, {r['ooms']:,} OOMs")
    for k in ("zoom", "step", "jump", "oom", "flame"):
        print(line(k, r[k]))
    print(f"flame      {r['stacks']:,} stacks in the trace, {r['drawn']:,} nodes drawn at the peak")
    print(f"state      {r['note']}")
    if r["errors"]:
        print("page errors:", *r["errors"], sep="\n  ")
        sys.exit(1)


if __name__ == "__main__":
    main()
