"""Benchmark ``tracekit import torch`` on a large snapshot: wall time and peak memory against file size.

The snapshot is built from a real one (default ``traces/torch-train.pickle.gz``):
its history is repeated, each copy shifted to its own address range and later
in time, until the pickle reaches ``--size-mb``; frame dicts stay shared, as
PyTorch shares them (every row's whole stack is kept, as the importer always
does). Each reader (the compiled scanner, the restricted unpickler) then
imports it in a fresh process that reports its own peak resident memory
(VmHWM) and CPU time, and the trace's size.

Usage: python scripts/bench_torch_import.py [--size-mb 1024] [--keep DIR]
"""

from __future__ import annotations

import argparse
import gzip
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(src: Path, dest: Path, size_mb: int) -> int:
    with gzip.open(src) as f:
        snap = pickle.load(f)
    base = snap["device_traces"][0]
    per_entry = len(pickle.dumps(base, protocol=4)) / len(base)
    copies = max(1, int(size_mb * 2**20 / per_entry / len(base)))
    span = base[-1]["time_us"] - base[0]["time_us"] + 1
    hist = []
    for r in range(copies):
        shift, dt = r << 40, r * span
        for e in base:
            c = dict(e)
            if "addr" in c:
                c["addr"] += shift
            c["time_us"] += dt
            c["frames"] = list(e.get("frames", []))
            hist.append(c)
    segs = []
    for r in range(copies):  # the final state of every copy
        for g in snap["segments"]:
            g2 = dict(g, address=g["address"] + (r << 40))
            g2["blocks"] = [dict(b, address=b["address"] + (r << 40)) for b in g["blocks"]]
            segs.append(g2)
    snap["segments"], snap["device_traces"] = segs, [hist]
    with open(dest, "wb") as f:
        pickle.dump(snap, f, protocol=4)
    return len(hist)


def child(mode: str, snap: str, out: str) -> None:
    """Import in this fresh process, then print its peak resident bytes and CPU seconds."""
    from tracekit.importers.torch_snapshot import import_snapshot

    import_snapshot(snap, out, fast={"scan": True, "unpickle": False}[mode], progress=False,
                    force=True)
    status = Path("/proc/self/status").read_text()
    hwm = int(status.split("VmHWM:")[1].split()[0]) * 1024
    use = resource.getrusage(resource.RUSAGE_SELF)
    print(hwm, use.ru_utime + use.ru_stime)


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--source", type=Path, default=ROOT / "traces" / "torch-train.pickle.gz")
    ap.add_argument("--keep", type=Path, default=None,
                    help="Folder to keep the snapshot and trace in (one built there before is reused).")
    ap.add_argument("--modes", default="scan,unpickle", help="Readers to measure: scan, unpickle.")
    a = ap.parse_args()
    work = a.keep or Path(tempfile.mkdtemp(prefix="tk-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    snap, out = work / "big.pickle", work / "big.parquet"
    t = time.perf_counter()
    count = work / "big.entries"
    if a.keep is not None and snap.exists() and count.exists():  # built by an earlier run with --keep
        entries = int(count.read_text())
    else:
        entries = build(a.source, snap, a.size_mb)
        count.write_text(str(entries))
    size = snap.stat().st_size
    print(f"built {snap} : {size / 2**20:.0f} MiB, {entries:,} entries in {time.perf_counter() - t:.1f} s")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for mode in a.modes.split(","):
        t = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--child", mode, str(snap), str(out)], env=env,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t
        if r.returncode:
            print(r.stderr)
            return r.returncode
        # The child's own high-water mark (VmHWM): getrusage would count pages shared with this
        # process at fork time.
        peak, cpu = (float(x) for x in r.stdout.split())
        print(f"import ({mode}): {wall:.1f} s wall, {cpu:.1f} s CPU "
              f"({entries / cpu / 1e6:.2f} M entries per CPU second), "
              f"peak RSS {peak / 2**30:.2f} GiB = {peak / size:.1f} x the file, "
              f"trace {out.stat().st_size / 2**20:.1f} MiB")
    if a.keep is None:
        for p in (snap, out, count):
            p.unlink(missing_ok=True)
        work.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
