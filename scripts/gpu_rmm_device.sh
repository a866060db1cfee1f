#!/usr/bin/env bash
# On a GPU machine with RMM's wheels carried in .whl/ (issue 42): `record --rmm` of real programs on
# RMM's allocators against RMM's own statistics (tests/gpu/test_record_rmm_gpu.py), `replay --device 0
# --allocator rmm-pool` against RMM's pool called directly (tests/gpu/test_device_rmm_gpu.py over the
# committed logs and traces/fidelity/rmm.json), then, with RMM_FIDELITY=1, the model-vs-real-pool
# fidelity run again. ONE tarball $OUT/rmmdev.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=300 [RMM_FIDELITY=1] bash scripts/gpu_rmm_device.sh
NAME=rmmdev
source "$(dirname "$0")/gpu_common.sh"

step "install RMM"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$R/rmm-install.log" 2>&1
export PYTHONPATH=/tmp/site:$PYTHONPATH

step "record --rmm against RMM's statistics"
run record-rmm 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/gpu/test_record_rmm_gpu.py
pack

step "the verb against RMM's pool"
run device-rmm 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/gpu/test_device_rmm_gpu.py
pack

if [[ -n "${RMM_FIDELITY:-}" ]] && (( $(left) > 70 )); then
  step "rmm fidelity"
  run rmm 150 python3 scripts/gpu_rmm_fidelity.py --logs traces --out "$R/rmm"
fi
step done
