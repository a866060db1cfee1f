#!/usr/bin/env bash
# On a GPU machine: the transparency suite $SUITE_RUNS times (default 1; 0 skips it), then the recording
# overhead of this tree against an earlier one ($BASE, default .ext/base: `git archive COMMIT
# tracekit scripts | tar -x -C .ext/base`), alternating processes (scripts/bench_record_ab.py).
# Everything goes into ONE tarball $OUT/ab.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=400 bash scripts/gpu_overhead_ab.sh
NAME=ab
source "$(dirname "$0")/gpu_common.sh"
EXAMPLES=${EXAMPLES:-.ext/cupy-examples/examples}
BASE=${BASE:-.ext/base}
before_pack() { rm -rf "$R"/suite*/work; }

for i in $(seq "${SUITE_RUNS:-1}"); do
  step "transparency suite, run $i"
  run "suite$i" 200 python3 scripts/gpu_transparency.py "$R/suite$i" --examples "$EXAMPLES" --jobs 10 --timeout 120
  pack
done
if [ "${ROUNDS:-4}" -gt 0 ]; then  # ROUNDS=0: the suite alone
  step "overhead, this tree against $BASE"
  run ab 300 python3 scripts/bench_record_ab.py --base "$BASE" --rounds "${ROUNDS:-4}" --repeats "${REPEATS:-5}" \
    --json "$R/ab.json"
fi
step done
