#!/usr/bin/env bash
# On a GPU machine: every gpu- and torch-marked test (log only under $OUT), then the cuFFT
# JIT-callback probe's narrowing stand-ins and the recorded run.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
EXAMPLES=${EXAMPLES:-.ext/cupy-examples/examples}
timeout "${TESTS_S:-300}" python3 -m pytest -m "gpu or torch" -q -rfE -p no:cacheprovider tests/ > "$OUT/pytest.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/pytest.log" | tail -40
timeout "${PROBE_S:-90}" python3 scripts/gpu_cufft_callback_probe.py "$EXAMPLES/cufft/callback/jit_r2c_c2r_string.py" \
  --variants --only numpy-held-thread mmap-thread True --repeats 6 --out "$OUT/r2c-narrow.json" 2>&1 | tail -6
