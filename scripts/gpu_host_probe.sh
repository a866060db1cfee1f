#!/usr/bin/env bash
# On the device machine's host CPUs (issue 45): why the compiled kernels ran slower there than on the
# 2-core machine, and the whole commands. In order of what matters most, each step within what is
# left of BUDGET_S: the host's package versions and transparent huge pages; the CPU's speed at
# compute, branches and memory latency (scripts/probe_cpu.c); the best-fit kernel against the C++
# loop (scripts/probe_kernel_target.py); whole replay and analyze of 10M events against the C++
# process (bench_whole.py, min of RUNS); start-up to the first read (bench_startup.py); the
# interpreter's own start and its imports of NumPy, pyarrow and typer; the read of 10M events
# (bench_trace_io.py --read). GPU unused. ONE tarball $OUT/hostprobe.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=500 bash scripts/gpu_host_probe.sh
NAME=hostprobe
source "$(dirname "$0")/gpu_common.sh"

step machine
{ nproc; lscpu | grep -i "model name\|mhz\|cache"; uptime; python3 --version
  cat /sys/kernel/mm/transparent_hugepage/enabled 2>&1
  python3 -m pip show numba llvmlite numpy pyarrow typer 2>/dev/null | grep -E "^(Name|Version)"
} > "$R/machine.txt" 2>&1

step "the CPU's speed by kind of work (probe_cpu.c)"
cc -O2 -o "$WORK/probe_cpu" scripts/probe_cpu.c && run cpu 40 "$WORK/probe_cpu"
pack

step "kernel against the C++ loop"
run probe 150 python3 scripts/probe_kernel_target.py
pack

step "whole replay and analyze against the C++ process, 10M events"
run whole 240 python3 scripts/bench_whole.py --events 10000000 --runs "${RUNS:-3}" --json "$R/whole.json"
pack

step "start-up to the first read"
run startup 60 python3 scripts/bench_startup.py --runs 5
pack

step "interpreter start and imports (min of 7)"
for what in "pass" "import numpy" "import pyarrow.parquet" "import numpy, pyarrow.parquet, typer"; do
  (( $(left) > 10 )) || break
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

step "the read of 10M events (issue 45 item 1: at most 0.6 s on this host)"
run synth 60 python3 -m tracekit synth --pattern random --events 10000000 --seed 1 -o "$WORK/r10.parquet"
run read 90 python3 scripts/bench_trace_io.py --read "$WORK/r10.parquet" --runs 5
step done
