#!/usr/bin/env bash
# One call: issue 39's overhead measurement first where the machine is an H200 (bench_record_fresh.py
# --shuffle at the issue's size); then, on any GPU, a CuPy program whose default pool runs out at its
# limit while a pool of its own holds 32 MiB (scripts/pool_workloads.py default_limit_beside_user_pool):
# advise on the default pool's rows alone (CuPy's set_limit holds that pool's bytes only), and the
# real program run again under advise's best settings (advise --rerun 2, record --limit) as the
# witness. ONE tarball $OUT/default_rows.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=580 PROCESSES=4 REPEATS=3 bash scripts/gpu_default_pool_rows.sh
NAME=default_rows
source "$(dirname "$0")/gpu_common.sh"

step host
{ nvidia-smi --query-gpu=name --format=csv,noheader; nproc; uptime; } > "$R/host.log" 2>&1
step build
run build 60 python3 setup.py build_ext --inplace
if grep -q H200 "$R/host.log"; then
  step "issue 39: fresh processes"
  run fresh "$(( $(left) - 130 ))" python3 scripts/bench_record_fresh.py --processes "${PROCESSES:-4}" \
    --steps 3000 --repeats "${REPEATS:-3}" --shuffle --json "$R/fresh.json"
  pack
fi
step "the default pool's limit beside a pool of the program's own"
run record 60 python3 -m tracekit record -o "$R/default-beside-user.parquet" scripts/pool_workloads.py \
  default_limit_beside_user_pool
run advise 60 bash -c "python3 -m tracekit advise '$R/default-beside-user.parquet' --json > '$R/advise.json'"
run rerun 90 python3 -m tracekit advise "$R/default-beside-user.parquet" --rerun 2 --rerun-timeout 40 \
  --rerun-dir "$R/reruns" --json
step done
