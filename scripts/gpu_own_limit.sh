#!/usr/bin/env bash
# On a GPU machine, one call: a CuPy program that caps its pool itself (scripts/record_workloads.py
# oom: set_limit(256 MiB) when none is set) recorded WITHOUT record --limit, so the start metadata
# has no limit; then advise at the limit the run was held to (tracekit.trace.outcome.held_limit),
# and the real program run again under advise's best settings (advise --rerun). The witness beside
# it: the program's own OutOfMemoryError ("limit set to: ...") in record.log, and each rerun's exit.
# Then, where the machine is an H200, issue 39's overhead measurement (bench_record_fresh.py).
# ONE tarball $OUT/own_limit.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 bash scripts/gpu_own_limit.sh
NAME=own_limit
source "$(dirname "$0")/gpu_common.sh"

host_info
step build
run build 60 python3 setup.py build_ext --inplace
step record
run record 120 python3 -m tracekit record -o "$R/own.parquet" scripts/record_workloads.py oom
step advise
run advise 180 bash -c "python3 -m tracekit advise '$R/own.parquet' --json > '$R/advise.json'"
run advise_text 120 python3 -m tracekit advise "$R/own.parquet"
step rerun
run rerun 200 python3 -m tracekit advise "$R/own.parquet" --rerun 2 --rerun-timeout 90 --rerun-dir "$R/reruns"
pack
REPEATS=${REPEATS:-2} overhead_on_h200
step done
