#!/usr/bin/env bash
# On a GPU machine with RMM's wheels carried in .whl/ (issue 42): `replay --device 0 --allocator
# rmm-pool` against RMM's pool called directly (tests/gpu/test_device_rmm_gpu.py over the committed
# logs and traces/fidelity/rmm.json), then the model-vs-real-pool fidelity run again. ONE tarball
# $OUT/rmmdev.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=300 bash scripts/gpu_rmm_device.sh
NAME=rmmdev
source "$(dirname "$0")/gpu_common.sh"

step "install RMM"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl > "$R/rmm-install.log" 2>&1
export PYTHONPATH=/tmp/site:$PYTHONPATH

step "the verb against RMM's pool"
run device-rmm 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/gpu/test_device_rmm_gpu.py
pack

if (( $(left) > 70 )); then
  step "rmm fidelity"
  run rmm 150 python3 scripts/gpu_rmm_fidelity.py --logs traces --out "$R/rmm"
fi
step done
