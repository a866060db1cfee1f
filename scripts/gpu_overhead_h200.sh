#!/usr/bin/env bash
# Issue 39's overhead measurement where the machine is an H200 (bench_record_fresh.py --shuffle at the
# issue's own size: CuPy MLP, 3,000 steps, fresh processes, variants in a random order per repeat);
# on any other GPU, only the host and build logs (the measurement is the H200's). ONE tarball
# $OUT/overhead_h200.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 PROCESSES=4 REPEATS=3 bash scripts/gpu_overhead_h200.sh
NAME=overhead_h200
source "$(dirname "$0")/gpu_common.sh"

host_info
if ! on_h200; then
  step "not an H200: nothing measured"
  exit 0
fi
step build
run build 60 python3 setup.py build_ext --inplace
overhead_on_h200
step done
