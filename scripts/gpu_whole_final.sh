#!/usr/bin/env bash
# On the 16-core host of a GPU machine (CPU only): whole `replay --sim best-fit` with and without the
# head start against the C++ process on 10M events whose blocks each have an address of their own
# (issue 45's reference shape: scripts/unique_addresses.py), then start-up to the first read.
# ONE tarball $OUT/final.tar.gz.   OUT=/some/empty/dir BUDGET_S=420 bash scripts/gpu_whole_final.sh
NAME=final
source "$(dirname "$0")/gpu_common.sh"

step synth
run synth 60 python3 -m tracekit synth --pattern random --events 10000000 --seed 1 -o "$WORK/random.parquet"
run unique 60 python3 scripts/unique_addresses.py "$WORK/random.parquet" "$WORK/unique.parquet"
step compile
run compile 150 bash -c "TRACEKIT_HEAD_START=1 python3 -m tracekit replay $WORK/unique.parquet --sim best-fit; TRACEKIT_HEAD_START=0 python3 -m tracekit replay $WORK/unique.parquet --sim best-fit; python3 -m tracekit analyze $WORK/unique.parquet --json > /dev/null"
step startup
run startup 60 python3 scripts/bench_startup.py --runs 7
step whole
run whole "$(left)" python3 scripts/bench_whole.py --trace "$WORK/unique.parquet" --runs "${RUNS:-3}" \
  --head-start-ab --json "$R/whole.json"
step done
