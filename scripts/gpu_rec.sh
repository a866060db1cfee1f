#!/usr/bin/env bash
# On a GPU machine: record the version-2 fixtures (the seed's scenario, a user pool, an async
# pool, a PyTorch ResNet-50 with handled and fatal OOMs), run the recorder's GPU tests and the
# overhead benchmark, and pack everything into ONE tarball $OUT/rec.tar.gz (written on exit,
# also after a failure). Every step is limited so the whole run ends within BUDGET_S seconds.
#   OUT=/some/empty/dir BUDGET_S=240 bash scripts/gpu_rec.sh
NAME=rec
source "$(dirname "$0")/gpu_common.sh"
mkdir -p "$R/traces" "$R/gputests"
before_pack() {
  # a snapshot too large to come back is left out (its size is in sizes.txt)
  find "$R" -name '*.pickle' -delete
  find "$R" -name '*.pickle.gz' -size +9M -printf '%s %p (left out)\n' -delete >> "$R/sizes.txt" 2>/dev/null
}
TK="python3 -m tracekit"

step environment
{ nvidia-smi; python3 -c "import cupy, torch, sys; print(sys.version); print('cupy', cupy.__version__, 'torch', torch.__version__)"; } \
  > "$R/env.txt" 2>&1

step "record seed scenario"
run record-seed 60 $TK record -o "$R/traces/cupy-seed.parquet" scripts/seed_scenario.py
step "record user pool"
run record-user-pool 30 $TK record -o "$R/traces/cupy-user-pool.parquet" scripts/pool_workloads.py user_pool
step "record async pool"
run record-async 30 $TK record -o "$R/traces/cupy-async.parquet" scripts/pool_workloads.py async
step "record torch resnet"
run record-torch 90 $TK record --torch -o "$R/traces/torch-handled-oom.parquet" scripts/torch_workload_resnet.py
[ -f "$R/traces/torch-handled-oom.pickle" ] && gzip -9 "$R/traces/torch-handled-oom.pickle"
for f in "$R"/traces/*.parquet; do
  timeout "$(lim 20)" $TK info "$f" > "$f.info.txt" 2>&1
done
ls -l "$R"/traces > "$R/sizes.txt"

step "gpu tests: recorder v2"
run pytest-v2 100 env TRACEKIT_GPU_OUT="$R/gputests" python3 -m pytest -m gpu tests/gpu/test_record_gpu_v2.py -q -rA -p no:cacheprovider
step "overhead benchmark"
run bench 60 python3 scripts/bench_record_overhead.py --repeats 7 --json "$R/bench.json"
step "gpu tests: record --torch"
run pytest-torch 90 env TRACEKIT_GPU_OUT="$R/gputests" python3 -m pytest -m gpu tests/cli/test_torch_record.py -q -rA -p no:cacheprovider
step "gpu tests: recorder v1 checks"
run pytest-v1 60 python3 -m pytest -m gpu tests/gpu/test_record_gpu.py -q -rA -p no:cacheprovider
step done
