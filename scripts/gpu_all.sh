#!/usr/bin/env bash
# Every test marked gpu (selected by marker; modules that need polars or Ray skip themselves) plus the recording-overhead benchmark, in one run on a
# GPU machine; logs packed into $OUT/gpu-all.tar.gz (OUT defaults to ./out).
#   PYTHONPATH=. bash scripts/gpu_all.sh [OUT]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-${1:-out}}
R="$OUT/gpu-all"
mkdir -p "$R"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
pack() { tar czf "$OUT/gpu-all.tar.gz" -C "$OUT" gpu-all; }
trap pack EXIT
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv;
  python3 -c "import sys, cupy, torch; print(sys.version.split()[0], 'cupy', cupy.__version__, 'torch', torch.__version__)";
  git log --oneline -1; } > "$R/env.txt" 2>&1
cat "$R/env.txt"
echo "== gpu tests"
timeout "${TESTS_S:-300}" python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider tests/ \
  2>&1 | tee "$R/pytest-gpu.log" | tail -25
echo "== recording overhead"
timeout "${BENCH_S:-120}" python3 scripts/bench_record_overhead.py --json "$R/overhead.json" \
  2>&1 | tee "$R/overhead.log" | tail -15
