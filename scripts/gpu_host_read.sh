#!/usr/bin/env bash
# On the device machine's host CPUs (issue 45): the whole replay and analyze against the C++ process
# (without and with NumPy's huge pages), the read of a 10M-event trace against the tree before a
# change (GPU_BASE, a copy of its tracekit/ folder), start-up to the first read, and (ADVISE=1)
# advise at 10M events against one replay.
# GPU unused. ONE tarball $OUT/hostread.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 [GPU_BASE=.gpu_base] [ADVISE=0] bash scripts/gpu_host_read.sh
NAME=hostread
source "$(dirname "$0")/gpu_common.sh"
BASE=${GPU_BASE:-.gpu_base}
TRACE=${TRACE_DIR:-/tmp/tracekit-host}/r10.parquet
mkdir -p "$(dirname "$TRACE")"

machine

if [ "${ADVISE:-0}" = 0 ]; then
import_floor 7 60

step "kernels compiled (this tree, then the reader's of the tree before)"
run precompile 240 python3 -m tracekit.cli.precompile
[ -d "$BASE/tracekit" ] && run precompile-base 60 env PYTHONPATH="$BASE" python3 -c \
  "from tracekit.trace.reader import read_trace; import sys; read_trace(sys.argv[1])" traces/cupy-mlp.parquet
[ -f "$TRACE" ] || run synth 90 python3 -m tracekit synth --pattern random --events 10000000 -o "$TRACE"
pack

step "start-up to the first read"
run startup 60 python3 scripts/bench_startup.py --runs 5
pack

step "whole replay and analyze against the C++ process"
run whole 150 python3 scripts/bench_whole.py --trace "$TRACE" --runs 3 --json "$R/whole.json"
pack

step "the same with NumPy's huge pages the other way (NUMPY_MADVISE_HUGEPAGE=$HUGE_ALT)"
run whole-hugepages 150 env NUMPY_MADVISE_HUGEPAGE="$HUGE_ALT" python3 scripts/bench_whole.py --trace "$TRACE" \
  --runs 3 --json "$R/whole-hugepages.json"
pack

step "the read, against the tree before"
run read 100 python3 scripts/bench_trace_io.py --read "$TRACE" ${BASE:+--against "$BASE"} --runs "${RUNS:-5}"
pack

else
step "advise at 10M events against one replay"
run advise "${ADVISE_S:-420}" python3 scripts/bench_advise.py --events 10000000 --replay 2 \
  --kinds "${KINDS:-torch,cupy,raw}" --keep "$(dirname "$TRACE")/advise"
fi
step done
