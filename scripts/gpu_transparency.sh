#!/usr/bin/env bash
# On a GPU machine: the recorder's transparency suite (scripts/gpu_transparency.py: CuPy's examples
# and programs written for each lazily imported module, pool kind and misbehaviour, plus PyTorch
# programs under `record --torch`, each with and without recording beside an independent hook), the
# recorder's GPU tests, and the overhead benchmark. CuPy's examples/ are looked for in
# $EXAMPLES (default .ext/cupy-examples/examples, copied from CuPy's source repository, not
# committed). Everything goes into ONE tarball $OUT/transparency.tar.gz (written on exit).
# SUITE_ONLY=1 skips the benchmark and the tests.
#   OUT=/some/empty/dir BUDGET_S=400 bash scripts/gpu_transparency.sh
NAME=transparency
source "$(dirname "$0")/gpu_common.sh"
EXAMPLES=${EXAMPLES:-.ext/cupy-examples/examples}
before_pack() { rm -rf "$R/suite/work"; }

step environment
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import cupy, torch, sys; print(sys.version); print('cupy', cupy.__version__, 'torch', torch.__version__)"
} > "$R/env.txt" 2>&1

step "transparency suite"
run suite 330 python3 scripts/gpu_transparency.py "$R/suite" --examples "$EXAMPLES" --jobs 10 --timeout 120
pack
[ "${SUITE_ONLY:-0}" = 1 ] && exit 0

step "overhead benchmark"
run bench 70 python3 scripts/bench_record_overhead.py --steps 200 --repeats 7 --json "$R/bench.json"
pack

step "recorder gpu tests"
run pytest-gpu 120 python3 -m pytest -m gpu -q -rA -p no:cacheprovider -x \
  tests/gpu/test_record_gpu.py tests/gpu/test_record_gpu_v2.py tests/gpu/test_record_transparency_gpu.py
step done
