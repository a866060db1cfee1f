#!/usr/bin/env bash
# On a GPU machine: record --torch runs that end without finishing (os._exit, SIGKILL of itself,
# SIGKILL from outside mid-step), finished by the watcher from the tracker's ring
# (tracekit/record/torch_ring.py), against PyTorch's own allocation count; the tracker's build; the
# record --torch's overhead against PyTorch's own history. ONE tarball
# $OUT/torchends.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 bash scripts/gpu_torch_ends.sh
NAME=torchends
source "$(dirname "$0")/gpu_common.sh"

step "header"
TORCH_INC=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
grep -n -A45 "struct TraceEntry" "$TORCH_INC/c10/cuda/CUDACachingAllocator.h" > "$R/traceentry.h.txt" 2>&1
grep -rn "attachAllocatorTraceTracker\|using AllocatorTraceTracker" "$TORCH_INC/c10/cuda/" >> "$R/traceentry.h.txt" 2>&1

step "build the tracker"
run build 200 python3 -c '
import os, time, torch
from tracekit.record.torch_ring import build, library_path
d, v = os.path.dirname(os.path.abspath(torch.__file__)), str(torch.__version__)
t = time.perf_counter(); lib, why = build(d, v)
print("built", lib, why, f"{time.perf_counter() - t:.1f} s")
t = time.perf_counter(); lib, why = build(d, v)
print("cached", lib, why, f"{time.perf_counter() - t:.3f} s")'
pack

step "the ends"
TRACEKIT_GPU_OUT="$R/traces" run ends 300 python3 -m pytest -m gpu -q -rA -s -p no:cacheprovider \
  tests/gpu/test_record_torch_ends_gpu.py
pack

step "overhead against PyTorch's own history"
run overhead 120 python3 scripts/bench_torch_record.py --steps 40 --repeats 3 --json "$R/overhead.json"
pack

# RMM (issue 42), where its wheels were carried in .whl/: the model against RMM's real pool.
if ls .whl/*.whl >/dev/null 2>&1 && (( $(left) > 60 )); then
  step "rmm fidelity"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl > "$R/rmm-install.log" 2>&1
  PYTHONPATH=/tmp/site:$PYTHONPATH run rmm 240 python3 scripts/gpu_rmm_fidelity.py --out "$R/rmm"
fi
step done
