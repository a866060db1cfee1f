"""``whatif`` on an imported RMM log against ``whatif`` on a native trace of the same size (issue 42).

A synthetic RMM log of ``--rows`` rows (``scripts/rmm_synth_log.py``) is imported
(``tracekit import rmm``, timed), and a native trace of the same events is made from it (the
imported events written as a ``synthetic`` trace, without the RMM metadata and ``thread`` column:
the same work for every policy, so the ratio is what being an RMM trace costs); then
``tracekit whatif TRACE --json`` runs on each, fresh
processes interleaved, ``--runs`` rounds. Reported: the import's wall time, each whatif's min and
median wall seconds, and the ratio RMM / native on the minimum (the target: about 1.0, "in the
same time").

    PYTHONPATH=. python3 scripts/bench_rmm_whatif.py [--rows 10000000] [--runs 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def _native_copy(src: Path, dst: Path) -> None:
    """The events of ``src`` as a synthetic trace at ``dst`` (no extras, no RMM metadata)."""
    sys.path.insert(0, str(ROOT))
    from tracekit.trace import Source, TraceMeta, read_trace, write_trace

    write_trace(dst, TraceMeta.new(Source.SYNTHETIC), read_trace(src, extras=False).events)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    py = [sys.executable, "-m", "tracekit"]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "rmm.dev0.csv"
        rmm, native = Path(tmp) / "rmm.parquet", Path(tmp) / "native.parquet"
        subprocess.run([sys.executable, str(ROOT / "scripts" / "rmm_synth_log.py"), "--rows", str(args.rows),
                        "-o", str(log)], check=True, capture_output=True)
        import_s = _timed([*py, "import", "rmm", str(log), "-o", str(rmm)])
        _native_copy(rmm, native)
        walls: dict[str, list[float]] = {"rmm": [], "native": []}
        for _ in range(args.runs):
            for name, path in (("rmm", rmm), ("native", native)):
                walls[name].append(_timed([*py, "whatif", str(path), "--json"]))
        log_mb = log.stat().st_size / 1e6
    result = {
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}", "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_1min": os.getloadavg()[0],
        "rows": args.rows, "log_mb": round(log_mb, 1), "import_s": round(import_s, 2),
        "whatif_min_s": {k: round(min(v), 2) for k, v in walls.items()},
        "whatif_median_s": {k: round(statistics.median(v), 2) for k, v in walls.items()},
        "rmm_to_native_min": round(min(walls["rmm"]) / min(walls["native"]), 3),
        "rmm_to_native_median": round(statistics.median(walls["rmm"])
                                      / statistics.median(walls["native"]), 3),
    }
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
