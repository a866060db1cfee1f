#!/usr/bin/env bash
# On a GPU machine: the seed scenario recorded, then rerun with each cure `tracekit advise` names,
# measuring what each cure gives back (cudaMemGetInfo before/after) and whether the run then gets
# through the request that failed. Everything lands in ONE tarball $OUT/seed.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=200 bash scripts/gpu_seed_cures.sh
NAME=seed
source "$(dirname "$0")/gpu_common.sh"
mkdir -p "$R/traces"
TK="python3 -m tracekit record"
S=scripts/seed_scenario.py

step environment
{ nvidia-smi; python3 -c "import cupy, torch, sys; print(sys.version); print('cupy', cupy.__version__, 'torch', torch.__version__); print('cudaLimitStackSize' in dir(cupy.cuda.runtime))"; } \
  > "$R/env.txt" 2>&1

step "seed scenario, as it is"
run base 40 $TK -o "$R/traces/cupy-seed-base.parquet" $S --probe "$R/base.json"
step "cure: the stack limit lowered after the kernel"
run stack 40 $TK -o "$R/traces/cupy-seed-cure-stack.parquet" $S --cure stack --probe "$R/stack.json"
step "cure: the other process stopped"
run other 60 $TK -o "$R/traces/cupy-seed-cure-other.parquet" $S --cure other-process --probe "$R/other.json"
step "heap: raised to 4 GiB before a malloc kernel"
run heap 40 $TK -o "$R/traces/cupy-seed-heap.parquet" $S --no-local --heap-mib 4096 --probe "$R/heap.json"
step "cure: the heap left at its limit"
run heapcure 40 $TK -o "$R/traces/cupy-seed-cure-heap.parquet" $S --no-local --heap-mib 4096 --cure heap --probe "$R/heapcure.json"
step "PyTorch: cuCtxSetLimit after the kernel"
run torch 40 python3 $S torch-stack --probe "$R/torch.json"
ls -l "$R/traces" > "$R/sizes.txt"
step done
