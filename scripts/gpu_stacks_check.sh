#!/usr/bin/env bash
# On a GPU machine, one call: the cuFFT JIT-callback example recorded and plain (the held spool
# descriptor), the recording overhead with whole stacks, every gpu- and torch-marked test, and a
# CuPy recording with whole stacks for traces/. Results under $OUT (default ./out).
#   EXAMPLES=.ext/cupy-examples/examples bash scripts/gpu_stacks_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
EXAMPLES=${EXAMPLES:-.ext/cupy-examples/examples}
echo "== r2c"; timeout 100 python3 scripts/gpu_cufft_callback_probe.py "$EXAMPLES/cufft/callback/jit_r2c_c2r_string.py" \
  --variants --only True False --repeats 8 --out "$OUT/r2c-after.json" 2>&1 | tail -4
echo "== overhead"; timeout 120 python3 scripts/bench_record_overhead.py --steps 200 --repeats 15 \
  --json "$OUT/record_overhead_stacks.json" > "$OUT/overhead.log" 2>&1; tail -12 "$OUT/overhead.log"
echo "== record"; timeout 60 python3 -m tracekit record --limit 256MiB -o "$OUT/cupy-oom-frag-stacks.parquet" \
  scripts/record_workloads.py oom > "$OUT/record.log" 2>&1; tail -3 "$OUT/record.log"
echo "== tests"; TRACEKIT_GPU_OUT="$OUT" timeout 320 python3 -m pytest -m "gpu or torch" -q -rfEs -p no:cacheprovider tests/ \
  > "$OUT/pytest.log" 2>&1; tail -25 "$OUT/pytest.log"
