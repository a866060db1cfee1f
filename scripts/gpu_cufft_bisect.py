"""On a GPU machine: which part of ``tracekit record`` makes CuPy's
``examples/cufft/callback/jit_r2c_c2r_string.py`` fail with ``CUFFT_INTERNAL_ERROR``?

Each condition runs the example ``--repeats`` times, one fresh process after another, with a warm
callback cache (``--cold``: a fresh one per run, as the transparency suite runs it): the
recorder whole, and the recorder with one part switched off in its own
process (monkeypatched by a wrapper, never in tracekit itself): the flusher thread, the memory
hook, the start-of-recording budget (NVML and the device limits), the site capture; the spool's
thread writing every interval instead of only after a silence; and the example after importing
the recorder only. Exit codes and the last stderr line go to one JSON.

    python3 scripts/gpu_cufft_bisect.py EXAMPLE.py --out $OUT/bisect.json [--repeats 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRAP = """
import sys, runpy
mode, out, example = sys.argv[1:4]
parts = set(mode.split("+"))
from tracekit.record import session, spool
if "nothread" in parts:
    spool.SpoolWriter.start = lambda self: None
if "nobudget" in parts:
    session.measure_budget = lambda device_id: "switched off"
if "silence0" in parts:  # the spool's thread writes every interval, not only after a silence
    _init = spool.SpoolWriter.__init__
    def _init0(self, *a, **k):
        _init(self, *a, **{**k, "silence": 0.0})
    spool.SpoolWriter.__init__ = _init0
if "nohook" in parts:
    import cupy
    cupy.cuda.MemoryHook.__enter__ = lambda self: self
    cupy.cuda.MemoryHook.__exit__ = lambda self, *a: None
if "imports" in parts:
    sys.argv = [example]
    runpy.run_path(example, run_name="__main__")
    sys.exit(0)
from tracekit.cli.app import app
args = ["record", "--force", "-o", out] + (["--no-sites"] if "nosites" in parts else []) + [example]
app(args)
"""
CONDITIONS = ("plain", "imports", "record", "nothread", "nohook", "nobudget", "nothread+nohook", "nosites",
              "silence0")


def one(example: str, mode: str, cache: str, work: str) -> dict[str, object]:
    env = {**os.environ, "CUPY_CACHE_DIR": cache, "PYTHONPATH": str(ROOT)}
    out = os.path.join(work, f"t{time.monotonic_ns()}.parquet")
    if mode == "plain":
        cmd = [sys.executable, example]
    else:
        wrap = os.path.join(work, "wrap.py")
        Path(wrap).write_text(WRAP)
        cmd = [sys.executable, wrap, "" if mode == "record" else mode, out, example]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    tail = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("Wrote ")][-1:] or [""]
    return {"mode": mode, "code": p.returncode, "seconds": round(time.perf_counter() - t0, 2),
            "last_stderr": tail[0][-300:]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("example")
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--only", nargs="*", default=list(CONDITIONS))
    ap.add_argument("--cold", action="store_true", help="a fresh callback cache (CUPY_CACHE_DIR) per run")
    a = ap.parse_args()
    example = os.path.abspath(a.example)
    res: dict[str, list[dict[str, object]]] = {}
    with tempfile.TemporaryDirectory() as work:
        warm = os.path.join(work, "warm-cache")
        one(example, "plain", warm, work)
        for _ in range(a.repeats):  # interleaved: a drift of the machine touches every condition
            for mode in a.only:
                cache = tempfile.mkdtemp(dir=work) if a.cold else warm
                res.setdefault(mode, []).append(one(example, mode, cache, work))
            summary = {k: f"{sum(x['code'] != 0 for x in v)}/{len(v)} failed" for k, v in res.items()}
            Path(a.out).write_text(json.dumps({"summary": summary, "runs": res}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
