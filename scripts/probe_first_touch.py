#!/usr/bin/env python3
"""What a process's first touch of fresh memory costs on this machine, and whether faulting the pages
in ahead on several threads (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14+) takes it off the copy:
the read of a 10M-event trace copies its columns into about 640 MB of fresh arrays.

Each run is a fresh process that allocates ten arrays (7 x int64, 1 x int8, 2 x int32 of N rows),
optionally populates them on T threads, then copies into them. A pause before each run lets the
guest hand freed pages back to the hypervisor (free page reporting), which makes them cold again.

    python3 scripts/probe_first_touch.py [--rows 10000000] [--threads 0 2 8 16] [--pause 8] [--rounds 2]

Prints one JSON line per run: threads (0: none), populate s, copy s, total s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import threading
import time

MADV_POPULATE_WRITE = 23
PAGE = 4096


def _child(rows: int, threads: int) -> None:
    import numpy as np

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    t0 = time.perf_counter()
    arrays = [np.empty(rows, np.int64) for _ in range(7)] + [np.empty(rows, np.int8)] + \
        [np.empty(rows, np.int32) for _ in range(2)]
    src = np.arange(rows, dtype=np.int64)
    failed = []
    if threads:
        spans = []
        for a in arrays:  # page-aligned pieces of about 16 MB, handed out to the threads in turn
            lo = (a.ctypes.data + PAGE - 1) // PAGE * PAGE
            hi = (a.ctypes.data + a.nbytes) // PAGE * PAGE
            spans += [(s, min(s + (16 << 20), hi)) for s in range(lo, hi, 16 << 20)]

        def work(k: int) -> None:
            for lo, hi in spans[k::threads]:
                if libc.madvise(lo, hi - lo, MADV_POPULATE_WRITE):
                    failed.append(ctypes.get_errno())

        ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    t1 = time.perf_counter()
    for a in arrays:
        np.copyto(a, src, casting="unsafe")
    t2 = time.perf_counter()
    print(json.dumps({"threads": threads, "populate_s": round(t1 - t0, 3), "copy_s": round(t2 - t1, 3),
                      "total_s": round(t2 - t0, 3), "madvise_errors": sorted(set(failed))}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--threads", type=int, nargs="+", default=[0, 2, 8, 16])
    ap.add_argument("--pause", type=float, default=8.0, help="seconds before each run (pages go cold)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child is not None:
        _child(a.rows, a.child)
        return 0
    for _ in range(a.rounds):
        for t in a.threads:
            time.sleep(a.pause)
            subprocess.run([sys.executable, __file__, "--rows", str(a.rows), "--child", str(t)], check=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
