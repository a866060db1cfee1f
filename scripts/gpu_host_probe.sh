#!/usr/bin/env bash
# On the device machine's host CPUs: why the compiled kernels run slower there than on the 2-core
# machine (issue 45) and where start-up goes. The host's package versions, transparent huge pages,
# the CPU's speed at compute, branches and memory latency (scripts/probe_cpu.c), the interpreter's own start and its imports of NumPy, pyarrow and typer (the floor under a verb's
# start-up), the best-fit kernel against the C++ loop with the host's numba and again with the numba
# a fresh install of tracekit gets (wheels carried in .whlnb, installed to /tmp/nb), then the whole
# commands against the C++ process with the carried numba; the read of 10M events. GPU unused. ONE tarball $OUT/hostprobe.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=500 bash scripts/gpu_host_probe.sh
NAME=hostprobe
source "$(dirname "$0")/gpu_common.sh"

step machine
{ nproc; lscpu | grep -i "model name\|mhz\|cache"; uptime; python3 --version
  cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1
  python3 -m pip show numba llvmlite numpy pyarrow typer 2>/dev/null | grep -E "^(Name|Version)"
} > "$R/machine.txt" 2>&1

step "interpreter start and imports (min of 7)"
for what in "pass" "import numpy" "import pyarrow.parquet" "import numpy, pyarrow.parquet, typer" "import numba"; do
  python3 - "$what" >> "$R/imports.txt" 2>&1 <<'PY'
import subprocess, sys, time
code = sys.argv[1]
ts = []
for _ in range(7):
    t = time.perf_counter(); subprocess.run([sys.executable, "-c", code], check=True); ts.append(time.perf_counter() - t)
print(f"{min(ts):.3f} s (median {sorted(ts)[3]:.3f}): python3 -c {code!r}")
PY
done
python3 -X importtime -m tracekit replay traces/cupy-oom-frag.parquet --sim best-fit > /dev/null 2> "$R/importtime.txt"
sort -t'|' -k2 -n -r "$R/importtime.txt" | head -40 > "$R/importtime_top.txt"
pack

step "the CPU's speed by kind of work (probe_cpu.c)"
cc -O2 -o "$WORK/probe_cpu" scripts/probe_cpu.c && run cpu 60 "$WORK/probe_cpu"
pack
step "kernel against the C++ loop, the host's numba"
run probe_host 150 python3 scripts/probe_kernel_target.py
pack
step "the read of 10M events (issue 45 item 1: at most 0.6 s on this host)"
run synth 60 python3 -m tracekit synth --pattern random --events 10000000 --seed 1 -o "$WORK/r10.parquet"
run read 90 python3 scripts/bench_trace_io.py --read "$WORK/r10.parquet" --runs 5
pack
[ -d .whlnb ] || { step "no carried numba"; exit 0; }
step "install the carried numba"
mkdir -p /tmp/nb && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/nb .whlnb/*.whl > "$R/install.log" 2>&1
PYTHONPATH=/tmp/nb:. python3 -c "import numba, llvmlite; print(numba.__version__, llvmlite.__version__)" >> "$R/install.log" 2>&1
step "kernel against the C++ loop, the carried numba"
PYTHONPATH=/tmp/nb:. NUMBA_CACHE_DIR=/tmp/nbcache run probe_carried 200 python3 scripts/probe_kernel_target.py
pack
step "whole commands, the carried numba"
PYTHONPATH=/tmp/nb:. NUMBA_CACHE_DIR=/tmp/nbcache run whole_carried "$(left)" python3 scripts/bench_whole.py \
  --events 10000000 --runs 3 --json "$R/whole_carried.json"
step done
