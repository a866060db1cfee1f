#!/usr/bin/env python3
"""Start-up of ``replay``, ``analyze`` and ``advise``: seconds from process start to the first read.

Target (issue 45, "Start fast"): at most 0.3 s from the moment the process is started until the
trace begins to be read. Each run is a fresh ``python -m tracekit VERB ...`` (through ``runpy``, as
``-m`` does) with one hook added: an import hook that, the moment ``tracekit.trace.reader`` has been
executed, wraps its ``open_parquet`` (every read of a trace, its metadata included, opens the file
there), so the first call records the clock and ends the process at once; nothing else is imported
ahead of the verb, in no other order. The clock is ``CLOCK_MONOTONIC``, read by this script just
before it starts the process and by the hook, so process creation and the interpreter's own start are
counted. Each verb runs ``--runs`` times (default 7); the minimum is the figure, the median beside it.
Beside it: the whole command's wall time (the same command run to the end, min of the same number of
runs), the number of modules loaded at the first read and the top-level packages with the most of
them, and which of the modules the verbs must not import before reading (``AVOIDED``) were loaded
all the same.

    .venv/bin/python scripts/bench_startup.py [--runs N] [--trace traces/cupy-oom-frag.parquet]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "cupy-oom-frag.parquet"

# Modules none of the three verbs needs before the trace is read (tests/cli/test_startup_imports.py
# asserts the same for the import of each verb's code).
AVOIDED = ("scipy", "tracekit.advise.counterfactual", "matplotlib", "polars", "cupy", "torch")

HOOK = r"""
import os, runpy, sys, time
from importlib.abc import MetaPathFinder

AVOIDED = {avoided!r}

def _first_read(real):
    def opened(*args, **kwargs):
        t = time.clock_gettime(time.CLOCK_MONOTONIC)
        loaded = sorted(m for m in AVOIDED if m in sys.modules)
        said = "%r %d %s" % (t, len(sys.modules), ",".join(loaded))
        if os.environ.get("TRACEKIT_BENCH_MODULES"):  # the modules themselves, for where they come from
            with open(os.environ["TRACEKIT_BENCH_MODULES"], "w") as f:
                f.write("\n".join(sorted(sys.modules)))
        os.write(int(os.environ["TRACEKIT_BENCH_FD"]), said.encode())
        os._exit(0)
    return opened

class _Finder(MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "tracekit.trace.reader":
            return None
        sys.meta_path.remove(self)
        from importlib.util import find_spec
        spec = find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            module.open_parquet = _first_read(module.open_parquet)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Finder())
sys.argv = ["tracekit", *sys.argv[1:]]
runpy.run_module("tracekit", run_name="__main__", alter_sys=True)
"""


def commands(trace: Path) -> dict[str, list[str]]:
    return {
        "replay": ["replay", str(trace), "--sim", "best-fit"],
        "analyze": ["analyze", str(trace)],
        "advise": ["advise", str(trace)],
    }


def first_read(args: list[str], modules: Path | None = None) -> tuple[float, int, list[str]]:
    """Seconds from starting the process to its first ``open_parquet``; modules then; avoided ones.
    ``modules``: a file to write the loaded modules' names to."""
    r, w = os.pipe()
    start = time.clock_gettime(time.CLOCK_MONOTONIC)
    proc = subprocess.Popen([sys.executable, "-c", HOOK.format(avoided=AVOIDED), *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, pass_fds=(w,),
                            env={**os.environ, "TRACEKIT_BENCH_FD": str(w),
                                 "TRACEKIT_BENCH_MODULES": str(modules or "")})
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    _, err = proc.communicate()
    if not said:
        raise SystemExit(f"{' '.join(args)}: never read the trace (exit {proc.returncode}): {err.decode()}")
    t, n, loaded = said.split(" ", 2)
    return float(t) - start, int(n), [m for m in loaded.split(",") if m]


def whole(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "tracekit", *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ns = ap.parse_args()
    out: dict[str, object] = {
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "load": os.getloadavg()[0], "trace": str(ns.trace), "runs": ns.runs, "target_s": 0.3, "verbs": {},
    }
    for verb, args in commands(ns.trace).items():
        whole(args)  # warm the file cache and numba's index once
        listing = Path(tempfile.mkdtemp()) / "modules.txt"
        reads = [first_read(args, listing if i == 0 else None) for i in range(ns.runs)]
        names = listing.read_text().split()
        packages = collections.Counter(name.split(".")[0] for name in names)
        walls = [whole(args) for _ in range(ns.runs)]
        firsts = [t for t, _, _ in reads]
        out["verbs"][verb] = {  # type: ignore[index]
            "first_read_s": round(min(firsts), 3), "first_read_median_s": round(statistics.median(firsts), 3),
            "whole_command_s": round(min(walls), 3), "modules_at_first_read": reads[0][1],
            "avoided_but_loaded": reads[0][2],
            # where the modules come from: the top-level packages with the most modules loaded
            "packages_at_first_read": dict(packages.most_common(15)),
        }
        shutil.rmtree(listing.parent, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
