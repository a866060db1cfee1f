#!/usr/bin/env bash
# On a GPU machine: record every CuPy workload into traces, describe them with `tracekit info`,
# run the recorder's GPU tests and the overhead benchmark, and pack it all into
# $OUT/record.tar.gz (OUT defaults to ./out; written on exit, also after a failure). Writes
# nothing outside $OUT and a temp folder. BUDGET_S (default 280) bounds the run.
#   PYTHONPATH=. bash scripts/gpu_record.sh [OUT]
NAME=record
BUDGET_S=${BUDGET_S:-280}
source "$(dirname "$0")/gpu_common.sh"
mkdir -p "$R/traces"

step environment
{ nvidia-smi; python3 -c "import cupy, sys; print(sys.version); print('cupy', cupy.__version__)"; } \
  > "$R/env.txt" 2>&1

for w in mlp fft sort; do
  step "record $w"
  run "record-$w" 90 python3 -m tracekit record -o "$R/traces/cupy-$w.parquet" scripts/record_workloads.py "$w"
done
step "record oom"
run record-oom 60 python3 -m tracekit record --limit 256MiB -o "$R/traces/cupy-oom-frag.parquet" \
  scripts/record_workloads.py oom

for f in "$R"/traces/*.parquet; do
  timeout "$(lim 30)" python3 -m tracekit info "$f" > "$f.info.txt" 2>&1
done

step "gpu tests"
run pytest-gpu 150 python3 -m pytest -m gpu tests/gpu/test_record_gpu.py -q -rA -p no:cacheprovider
step "overhead benchmark"
run bench 100 python3 scripts/bench_record_overhead.py --json "$R/bench.json"
step done
