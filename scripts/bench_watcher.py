"""What the recorder's watcher costs: its start (once per recording, before the program) and its memory.

    python3 scripts/bench_watcher.py [--runs N]

Starts ``tracekit.record.watch.Watcher`` N times in a temporary folder, reading each start's wall time
and the resident memory of the waiting watcher (``/proc/PID/status`` VmRSS), then tells it the trace
is written. Per event the watcher costs nothing: it only waits on a pipe.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tracekit.record.watch import Watcher


def _rss_kib(folder: Path) -> int | None:
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tracekit.record.watch" in args and any(str(folder).encode() in a for a in args):
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    starts, rss = [], []
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for i in range(a.runs):
            t0 = time.perf_counter()
            w = Watcher.start(folder / f"t{i}.parquet.spool", folder / f"t{i}.parquet")
            starts.append(time.perf_counter() - t0)
            assert w is not None, "no watcher on this machine (pidfd_open missing)"
            kib = _rss_kib(folder)
            if kib is not None:
                rss.append(kib)
            w.done()
    med, top = statistics.median(starts) * 1e3, max(starts) * 1e3
    print(f"start: median {med:.1f} ms, max {top:.1f} ms over {a.runs}")
    if rss:
        print(f"watcher resident memory while waiting: median {statistics.median(rss) / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
