#!/usr/bin/env bash
# One call: issue 39's overhead measurement first where the machine is an H200 (bench_record_fresh.py
# --shuffle at the issue's size); then, on any GPU, a CuPy program whose default pool runs out at its
# limit while a pool of its own holds 32 MiB (scripts/pool_workloads.py default_limit_beside_user_pool):
# advise on the default pool's rows alone (CuPy's set_limit holds that pool's bytes only), and the
# real program run again under advise's best settings (advise --rerun 2, record --limit) as the
# witness. Last, scripts/pool_workloads.py user_pool_limit run for real at the pool limits where
# replay --sim cupy --pool 1 of its recording is not monotone (traces/fidelity/user-pool-limit/).
# ONE tarball $OUT/default_rows.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=580 PROCESSES=4 REPEATS=3 bash scripts/gpu_default_pool_rows.sh
NAME=default_rows
source "$(dirname "$0")/gpu_common.sh"

host_info
step build
run build 60 python3 setup.py build_ext --inplace
overhead_on_h200 130
step "the default pool's limit beside a pool of the program's own"
run record 60 python3 -m tracekit record -o "$R/default-beside-user.parquet" scripts/pool_workloads.py \
  default_limit_beside_user_pool
run advise 60 bash -c "python3 -m tracekit advise '$R/default-beside-user.parquet' --json > '$R/advise.json'"
run rerun 90 python3 -m tracekit advise "$R/default-beside-user.parquet" --rerun 2 --rerun-timeout 40 \
  --rerun-dir "$R/reruns" --json
step "the program's own pool at limits where the model's fitting is not monotone (50-54 fit, 56-60 fail)"
for m in 50 52 54 56 58 60 62; do
  run "user-pool-${m}MiB" 30 env USER_POOL_LIMIT_BYTES=$(( m << 20 )) python3 scripts/pool_workloads.py user_pool_limit
done
step done
