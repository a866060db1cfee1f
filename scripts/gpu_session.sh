#!/usr/bin/env bash
# On a GPU machine, one call: the recorder's overhead as issue 39 measures it (bench_record_fresh.py
# --shuffle, wall and, with waits sleeping, the thread's CPU), the recorder's stream GPU test, then
# the head start's whole-command A/B on the host's CPUs (bench_whole.py --head-start-ab, profile_head_start.py).
# ONE tarball $OUT/session.tar.gz.
# BLOCKING=0 skips the run with waits sleeping, HEAD_AB=0 the head start's A/B.
#   OUT=/some/empty/dir BUDGET_S=580 bash scripts/gpu_session.sh
NAME=session
source "$(dirname "$0")/gpu_common.sh"

step host
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uptime; } > "$R/host.log" 2>&1
step build
run build 60 python3 setup.py build_ext --inplace
python3 -c "import tracekit.record.fastpath as f; print('compiled', f.COMPILED)" >> "$R/build.log" 2>&1
step "stream test"
run stream 90 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/gpu/test_record_stream_gpu.py
step "fresh processes"
run fresh "${FRESH_S:-130}" python3 scripts/bench_record_fresh.py --processes "${PROCS:-3}" --steps "${STEPS:-300}" \
  --repeats "${REPEATS:-6}" --shuffle --json "$R/fresh.json"
pack
step "fresh processes, waits sleeping"
[ "${BLOCKING:-1}" = 1 ] && run blocking "${BLOCKING_S:-130}" python3 scripts/bench_record_fresh.py --processes "${PROCS:-3}" --steps "${STEPS:-300}" \
  --repeats "${REPEATS:-6}" --shuffle --blocking-sync --json "$R/blocking.json"
pack
[ "${HEAD_AB:-1}" = 1 ] || exit 0
step synth
run synth 60 python3 -m tracekit synth --pattern random --events 10000000 --seed 1 -o "$WORK/random.parquet"
step compile
run compile 150 bash -c "TRACEKIT_HEAD_START=1 python3 -m tracekit replay $WORK/random.parquet --sim best-fit; TRACEKIT_HEAD_START=0 python3 -m tracekit replay $WORK/random.parquet --sim best-fit; python3 -m tracekit analyze $WORK/random.parquet --json > /dev/null"
step profile
run profile 60 python3 scripts/profile_head_start.py "$WORK/random.parquet"
step whole
run whole "$(left)" python3 scripts/bench_whole.py --trace "$WORK/random.parquet" --runs "${RUNS:-3}" \
  --head-start-ab --json "$R/whole.json"
step done
