#!/usr/bin/env bash
# On a GPU machine: the recorder's overhead as issue 39 measures it (bench_record_fresh.py: fresh
# processes, pooled), the recorder's own host cost per event with waits for the device sleeping
# (BLOCKING_PROCS fresh processes, --blocking-sync: the timed thread's CPU time, apart from the
# device's timing), where it goes (bench_record_parts.py --count-resolves) and the pytest plugin's
# GPU test (PLUGIN=0 skips it). ONE tarball $OUT/fresh.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 [PROCS=5] [STEPS=1500] [BLOCKING_PROCS=0] bash scripts/gpu_overhead_fresh.sh
NAME=fresh
source "$(dirname "$0")/gpu_common.sh"

step build
run build 60 python3 setup.py build_ext --inplace
python3 -c "import tracekit.record.fastpath as f; print('compiled', f.COMPILED, f.Hook)" >> "$R/build.log" 2>&1

step "fresh processes"
run fresh "${FRESH_S:-330}" python3 scripts/bench_record_fresh.py --processes "${PROCS:-5}" \
  --steps "${STEPS:-1500}" --repeats "${REPEATS:-3}" --shuffle --json "$R/fresh.json"
pack

if [ "${BLOCKING_PROCS:-0}" -gt 0 ]; then
step "fresh processes, waits sleeping"
run blocking "${BLOCKING_S:-150}" python3 scripts/bench_record_fresh.py --processes "$BLOCKING_PROCS" \
  --steps "${STEPS:-1500}" --repeats "${REPEATS:-3}" --shuffle --blocking-sync --json "$R/blocking.json"
pack
fi

step "per-call parts"
run parts 100 python3 scripts/bench_record_parts.py --steps "${PARTS_STEPS:-600}" --repeats 3 --count-resolves \
  --json "$R/parts.json"
pack

[ "${PLUGIN:-1}" = 1 ] || exit 0
step "plugin gpu test"
run pytest-gpu 80 python3 -m pytest -m gpu -q -rA -p no:cacheprovider tests/gpu/test_pytest_plugin_gpu.py \
  tests/gpu/test_record_stream_gpu.py
step done
