#!/usr/bin/env bash
# On a GPU machine: record every CuPy workload into traces, describe them with `tracekit info`,
# run the recorder's GPU tests and the overhead benchmark, and pack it all into
# $OUT/record.tar.gz (OUT defaults to ./out). Writes nothing outside $OUT and a temp folder.
#   PYTHONPATH=. bash scripts/gpu_record.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-${1:-out}}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
WORK=$(mktemp -d)
R="$WORK/record"
mkdir -p "$R/traces"
step() { echo "== $* ($(date -u +%H:%M:%S))" | tee -a "$R/steps.log"; }
# Every step gets at most its own limit and never more than what is left of BUDGET_S
# (minus a margin for packing), so the tarball is always written.
BUDGET_S=${BUDGET_S:-280}
END=$(( $(date +%s) + BUDGET_S - 15 ))
lim() { local left=$(( END - $(date +%s) )); (( left < 5 )) && left=5; (( left < $1 )) && echo $left || echo "$1"; }

step environment
{ nvidia-smi; python3 -c "import cupy, sys; print(sys.version); print('cupy', cupy.__version__)"; } \
  > "$R/env.txt" 2>&1

for w in mlp fft sort; do
  step "record $w"
  timeout "$(lim 90)" python3 -m tracekit record -o "$R/traces/cupy-$w.parquet" \
    scripts/record_workloads.py "$w" > "$R/record-$w.log" 2>&1
  echo "exit code $?" >> "$R/record-$w.log"
done
step "record oom"
timeout "$(lim 60)" python3 -m tracekit record --limit 256MiB -o "$R/traces/cupy-oom-frag.parquet" \
  scripts/record_workloads.py oom > "$R/record-oom.log" 2>&1
echo "exit code $?" >> "$R/record-oom.log"

for f in "$R"/traces/*.parquet; do
  timeout "$(lim 30)" python3 -m tracekit info "$f" > "$f.info.txt" 2>&1
done

step "gpu tests"
timeout "$(lim 150)" python3 -m pytest -m gpu tests/test_record_gpu.py -q -rA -p no:cacheprovider \
  > "$R/pytest-gpu.log" 2>&1
echo "exit code $?" >> "$R/pytest-gpu.log"

step "overhead benchmark"
timeout "$(lim 100)" python3 scripts/bench_record_overhead.py --json "$R/bench.json" > "$R/bench.log" 2>&1
echo "exit code $?" >> "$R/bench.log"

step done
tar czf "$OUT/record.tar.gz" -C "$WORK" record
rm -rf "$WORK"
ls -l "$OUT"
