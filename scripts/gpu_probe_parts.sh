#!/usr/bin/env bash
# On a GPU machine: what the recorder's per-event pieces cost on this host (issue 39): the clock
# source and a clock read in C (probe_clock.c), then bench_record_parts.py (hook pieces in CuPy's
# loop and per call). ONE tarball $OUT/parts.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=300 bash scripts/gpu_probe_parts.sh
NAME=parts
source "$(dirname "$0")/gpu_common.sh"

step host
{ cat /sys/devices/system/clocksource/clocksource0/current_clocksource
  cat /sys/devices/system/clocksource/clocksource0/available_clocksource
  grep -m1 "model name" /proc/cpuinfo; grep -o "constant_tsc\|nonstop_tsc\|tsc_known_freq" /proc/cpuinfo | sort | uniq -c
  nproc; uptime; nvidia-smi --query-gpu=name --format=csv,noheader; } > "$R/host.log" 2>&1
run clock 30 bash -c "cc -O2 scripts/probe_clock.c -o $WORK/probe_clock && $WORK/probe_clock && $WORK/probe_clock"
step build
run build 60 python3 setup.py build_ext --inplace
step parts
run parts "${PARTS_S:-200}" python3 scripts/bench_record_parts.py --steps "${PARTS_STEPS:-600}" --repeats "${REPEATS:-3}" \
  --only "${ONLY:-none,noop,c_ignore,c_list,c_list_capsule,c_list_conststream,c_list_trim,c_ring,rec_no_sites,rec_sites}" \
  --json "$R/parts.json"
step done
