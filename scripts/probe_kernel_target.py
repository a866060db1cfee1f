"""Whether the best-fit kernel's speed on a host depends on the CPU target numba compiles for:
the host's CPU as LLVM names it and its main features, then the C++ bar of ``bench_sim.py``
(std::set best fit against the best-fit kernel, CPU seconds of the loop) with numba's default
target (the host) and again in a fresh process with ``NUMBA_CPU_NAME=generic`` (a cache of its own).

    PYTHONPATH=. python3 scripts/probe_kernel_target.py [--events 2000000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    a = ap.parse_args()
    import llvmlite.binding as ll

    ll.initialize_native_target()
    features = ll.get_host_cpu_features()
    print("llvm host cpu:", ll.get_host_cpu_name(),
          {k: bool(features.get(k)) for k in ("popcnt", "lzcnt", "bmi", "bmi2", "avx2", "avx512f")})
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "t.parquet"
        subprocess.run([sys.executable, "-m", "tracekit", "synth", "--pattern", "random", "--events",
                        str(a.events), "--seed", "1", "-o", str(trace)], check=True, cwd=ROOT)
        code = ("import sys; from pathlib import Path; sys.path.insert(0, 'scripts'); import bench_sim; "
                f"bench_sim.cpp_bar(Path({str(trace)!r}), Path({tmp!r}), 3)")
        generic = {"NUMBA_CPU_NAME": "generic", "NUMBA_CACHE_DIR": f"{tmp}/nb"}
        for label, extra in (("host target", {}), ("generic target", generic)):
            out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                                 env={**os.environ, **extra})
            print(label + ":", (out.stdout + out.stderr).strip().splitlines()[-1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
