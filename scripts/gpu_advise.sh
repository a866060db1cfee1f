#!/usr/bin/env bash
# On a GPU machine: `tracekit advise --verify-on-device` on the committed OOM traces and the
# GPU tests of advise; with RECORD=1 also the counterfactual runs behind traces/counterfactual/:
#  1. The PyTorch `oom` workload (scripts/torch_counterfactual.py run, the limit of
#     traces/torch-oom.parquet) recorded with `python -m tracekit record --torch` under the
#     default allocator settings and under each setting advise may recommend.
#  2. The CuPy `oom` workload (scripts/record_workloads.py oom) recorded under three set_limit
#     values: the recorded 256 MiB, 300 MiB (predicted to fail) and 308 MiB (predicted to fit).
#  3. cupy-oom-frag replayed on the device through cudaMalloc and MemoryAsyncPool at 256 MiB
#     (does the device allocator fit where the pool did not?).
#  4. (always) advise --verify-on-device 0 on traces/torch-oom.parquet and cupy-oom-frag.parquet,
#     and the GPU tests of advise.
# Everything is packed as $OUT/advise.tar.gz (written on every way out); BUDGET_S (default 240)
# bounds the run.
#   OUT=/some/dir bash scripts/gpu_advise.sh
NAME=advise
source "$(dirname "$0")/gpu_common.sh"
W=$R
mkdir -p "$W/torch" "$W/cupy" "$W/device"
LIMIT=15038676992  # pool_limit_bytes of traces/torch-oom.parquet

step environment
{ date -u; nvidia-smi; python3 -c "import torch, cupy, sys; print(sys.version); print('torch', torch.__version__, 'cupy', cupy.__version__); print(torch.cuda.mem_get_info(0))"; } \
  > "$W/env.txt" 2>&1

# name|PYTORCH_CUDA_ALLOC_CONF (empty = defaults); required ones first, extras if time is left
SETTINGS=(
  "default|"
  "expandable|expandable_segments:True"
  "gc08-split256|garbage_collection_threshold:0.8,max_split_size_mb:256"
  "split128|max_split_size_mb:128"
  "roundup4|roundup_power2_divisions:4"
)
EXTRA=(
  "gc08|garbage_collection_threshold:0.8"
  "split256|max_split_size_mb:256"
  "roundup4-split128|roundup_power2_divisions:4,max_split_size_mb:128"
  "default-again|"
)
record_torch() {
  local name=${1%%|*} conf=${1#*|}
  step "torch $name ($conf)"
  timeout "$(lim 90)" env PYTORCH_CUDA_ALLOC_CONF="$conf" python3 -m tracekit record --torch \
    -o "$W/torch/torch-cf-$name.parquet" scripts/torch_counterfactual.py run --limit-bytes $LIMIT \
    > "$W/torch/torch-cf-$name.log" 2>&1
  echo "exit code $?" >> "$W/torch/torch-cf-$name.log"
  [ -f "$W/torch/torch-cf-$name.pickle" ] && gzip -9 "$W/torch/torch-cf-$name.pickle"
}
record_cupy() {
  step "cupy oom at $1"
  timeout "$(lim 60)" python3 -m tracekit record --limit "$1" -o "$W/cupy/cupy-cf-$1.parquet" \
    scripts/record_workloads.py oom > "$W/cupy/cupy-cf-$1.log" 2>&1
  echo "exit code $?" >> "$W/cupy/cupy-cf-$1.log"
}
if ls tests/*/test_advise*.py > /dev/null 2>&1; then
  step "gpu tests"
  timeout "$(lim 150)" python3 -m pytest -m gpu tests/*/test_advise*.py -q -rA -p no:cacheprovider \
    > "$W/pytest-gpu.log" 2>&1
  echo "exit code $?" >> "$W/pytest-gpu.log"
fi
for t in torch-oom cupy-oom-frag; do
  step "advise $t --verify-on-device 0"
  timeout "$(lim 90)" python3 -m tracekit advise "traces/$t.parquet" --verify-on-device 0 --json \
    > "$W/device/advise-$t.json" 2> "$W/device/advise-$t.err"
  echo "exit code $?" >> "$W/device/advise-$t.err"
done
if [ "${RECORD:-0}" = 1 ]; then
  for s in "${SETTINGS[@]}"; do record_torch "$s"; done
  for l in 256MiB 308MiB 300MiB; do record_cupy "$l"; done
  for a in cuda cupy-async; do
    step "device replay cupy-oom-frag through $a at 256MiB"
    timeout "$(lim 60)" python3 -m tracekit replay traces/cupy-oom-frag.parquet --device 0 --allocator "$a" \
      --capacity 256MiB --json > "$W/device/oom-frag-$a.json" 2> "$W/device/oom-frag-$a.err"
    echo "exit code $?" >> "$W/device/oom-frag-$a.err"
  done
  for s in "${EXTRA[@]}"; do record_torch "$s"; done
fi

for f in "$W"/torch/*.parquet "$W"/cupy/*.parquet; do
  [ -e "$f" ] && timeout "$(lim 20)" python3 -m tracekit info "$f" > "$f.info.txt" 2>&1
done
step done
