#!/usr/bin/env bash
# Device replay through PyTorch's caching allocator on a real GPU: the torch GPU tests, the ground
# truth over every traces/torch-*.parquet (real allocator against the torch model, reserved bytes
# after every request), the replay-speed benchmark against a bare caching_allocator_alloc/delete
# loop, each committed torch trace through the CLI with --compare-sim torch, and the other device
# GPU tests. Writes only the tarball $OUT/devtorch.tar.gz (OUT defaults to ./out), packed after each
# step and on every way out. BUDGET_S (default 240) bounds the whole run.
#   OUT=/some/dir bash scripts/gpu_devtorch.sh
NAME=devtorch
source "$(dirname "$0")/gpu_common.sh"
mkdir -p "$R/replays" "$R/cli"
START=$(date +%s)
timed() {  # timed NAME LIMIT CMD...: run within the budget, keep stdout/stderr/rc/seconds
  local name=$1 limit=$2; shift 2
  if [ "$(left)" -le 5 ]; then echo "$name skipped (budget)" | tee -a "$R/steps.txt"; return; fi
  local t0; t0=$(date +%s.%N)
  timeout "$(lim "$limit")" "$@" >"$R/$name.out" 2>"$R/$name.err"
  local rc=$?
  echo "$name rc=$rc $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")s" | tee -a "$R/steps.txt"
}

{ nvidia-smi; python3 -c "import torch, numpy, pyarrow, sys; print(sys.version); print('torch', torch.__version__, \
'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('numpy', numpy.__version__, 'pyarrow', \
pyarrow.__version__)"; git log --oneline -1; date -u; } >"$R/env.txt" 2>&1

timed ground_truth 120 python3 scripts/torch_ground_truth.py --json "$R/ground_truth.json" --out "$R/replays"
pack
timed pytest_torch 110 python3 -m pytest -m gpu tests/gpu/test_device_torch_gpu.py -q -rfEs -p no:cacheprovider
pack
timed bench_torch 60 python3 scripts/bench_device_replay.py --allocator torch --events 100000 --repeat 2 \
  --json "$R/bench_torch.json"
pack
timed pytest_device 100 python3 -m pytest -m gpu tests/gpu/test_device_gpu.py -q -rfEs -p no:cacheprovider
pack
for b in torch-train torch-expandable torch-record-oom; do
  t=traces/$b.parquet
  timed "cli_$b" 40 python3 -m tracekit replay "$t" --device 0 --allocator torch --compare-sim torch
done
echo "total $(( $(date +%s) - START ))s" | tee -a "$R/steps.txt"
