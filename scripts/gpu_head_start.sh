#!/usr/bin/env bash
# On the 16-core host of a GPU machine (CPU only): whole `replay --sim best-fit` of 10M events with
# and without the head start against the C++ process (bench_whole.py --head-start-ab), and the head
# start's timeline (profile_head_start.py). ONE tarball $OUT/head.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=400 bash scripts/gpu_head_start.sh
NAME=head
source "$(dirname "$0")/gpu_common.sh"

step synth
run synth 60 python3 -m tracekit synth --pattern random --events 10000000 --seed 1 -o "$WORK/random.parquet"
step compile
run compile 200 bash -c "TRACEKIT_HEAD_START=1 python3 -m tracekit replay $WORK/random.parquet --sim best-fit; TRACEKIT_HEAD_START=0 python3 -m tracekit replay $WORK/random.parquet --sim best-fit; python3 -m tracekit analyze $WORK/random.parquet --json > /dev/null"
step profile
run profile 60 python3 scripts/profile_head_start.py "$WORK/random.parquet"
step "user and system time"
for hs in 0 1; do
  run "time$hs" 60 env TRACEKIT_HEAD_START=$hs /usr/bin/time -v python3 -m tracekit replay "$WORK/random.parquet" --sim best-fit
done
step whole
run whole "${WHOLE_S:-200}" python3 scripts/bench_whole.py --trace "$WORK/random.parquet" --runs "${RUNS:-3}" \
  --head-start-ab --json "$R/whole.json"
step done
