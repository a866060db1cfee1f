#!/usr/bin/env bash
# On the device machine's host CPUs (16 cores, quiet; issue 45's "16-core host"): whole commands
# against the C++ reference, start-up, the 10M read, and advise at 10M events against one replay.
# The GPU is not used. ONE tarball $OUT/hostspeed.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=420 bash scripts/gpu_host_speed.sh
NAME=hostspeed
source "$(dirname "$0")/gpu_common.sh"

step "machine"
{ nproc; lscpu | head -20; python3 --version; uptime; } > "$R/machine.txt" 2>&1

step "compile the kernels once (as pip install does)"
run precompile 200 python3 -m tracekit.cli.precompile

step "the best-fit kernel's speed by numba's CPU target"
[ "${PROBE:-1}" = 1 ] && run probe 150 python3 scripts/probe_kernel_target.py
pack

step "whole replay and analyze against the C++ process, 10M events"
[ "${WHOLE:-1}" = 1 ] && run whole 150 python3 scripts/bench_whole.py --events 10000000 --runs 3 --json "$R/whole.json"
pack

step "start-up to the first read"
[ "${STARTUP:-1}" = 1 ] && run startup 40 python3 scripts/bench_startup.py --runs 5
pack

step "advise at 10M events against one replay"
for kind in ${ADVISE_KINDS:-raw torch cupy}; do
  run "advise-$kind" 150 python3 scripts/bench_advise.py --events 10000000 --kinds "$kind" \
    --replay "${ADVISE_REPLAY:-1}" --keep /tmp/advise-bench
  [ "${PROFILE:-1}" = 1 ] && run "profile-advise-$kind" 90 python3 scripts/profile_advise.py \
    "/tmp/advise-bench/training-10000000-$kind.parquet" --json "$R/profile-advise-$kind.json"
  pack
done
step done
