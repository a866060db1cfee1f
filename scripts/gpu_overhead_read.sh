#!/usr/bin/env bash
# One call for this session's device work: issue 39's overhead measurement first where the machine
# is an H200 (bench_record_fresh.py --shuffle at the issue's size); then on any GPU, advise on a
# CuPy program's own pool that ran out at its own limit, checked by the real program run again
# (gpu_user_pool_limit.py); then on the 16-core host
# issue 45's first read: the columns' copies in parallel against on the reading thread, and the
# read's short GIL switch interval against Python's own (bench_trace_io.py --copy-ab --switch-ab),
# a profile of one first read, and start-up to the first read.
# ONE tarball $OUT/overhead_read.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=570 PROCESSES=4 REPEATS=3 bash scripts/gpu_overhead_read.sh
NAME=overhead_read
source "$(dirname "$0")/gpu_common.sh"

host_info
step build
run build 60 python3 setup.py build_ext --inplace
overhead_on_h200 240
step "a program's own pool out at its own limit"
run user_pool 150 python3 scripts/gpu_user_pool_limit.py "$R/user_pool"
pack
step synth
run synth 60 python3 -m tracekit synth -p random -n 10000000 --seed 1 -o "$WORK/r10m.parquet"
step read
run read 80 python3 scripts/bench_trace_io.py --read "$WORK/r10m.parquet" --copy-ab --switch-ab --runs "${RUNS:-5}"
step profile
run profile 30 python3 scripts/profile_read.py "$WORK/r10m.parquet"
pack
step startup
run startup 40 python3 scripts/bench_startup.py
step done
