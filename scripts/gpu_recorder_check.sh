#!/usr/bin/env bash
# On a GPU machine: the recorder's checks against real CuPy (nothing of CuPy's replaced, every end
# leaves a trace), in ONE tarball $OUT/recorder.tar.gz:
#   - builds the compiled fast path in place (python3 setup.py build_ext --inplace);
#   - scripts/gpu_identity.py: every attribute of CuPy's memory modules, with and without recording;
#   - scripts/gpu_ends.py: normal end, os._exit, SIGKILL (own and from outside), exec, segment ends;
#   - a slice of CuPy 14.2's own test suite (copied from CuPy's source repository into
#     .gpu_work/cupy, not committed) with and without `tracekit record`, compared by
#     scripts/junit_compare.py (test ids and outcomes);
#   - the recorder's GPU tests;
#   - with BASE=DIR (a tree of an earlier commit: git archive COMMIT tracekit scripts | tar -x -C DIR),
#     the overhead of this tree against it, in interleaved fresh processes (bench_record_ab.py).
#   OUT=/some/empty/dir BUDGET_S=560 bash scripts/gpu_recorder_check.sh
NAME=recorder
source "$(dirname "$0")/gpu_common.sh"
REPO=$(pwd)
before_pack() { rm -rf "$R/ends"; }

step build
run build 60 python3 setup.py build_ext --inplace
python3 -c "import tracekit.record.fastpath as f; print('compiled', f.COMPILED)" >> "$R/build.log" 2>&1

step identity
for mode in none plain async; do
  timeout "$(lim 40)" python3 scripts/gpu_identity.py $mode >> "$R/identity.jsonl" 2>>"$R/identity.err"
done

step ends
run ends 120 python3 scripts/gpu_ends.py "$R/ends"
pack

step "cupy test slice"
T=tests/cupy_tests
FILES="$T/cuda_tests/test_memory.py $T/cuda_tests/test_memory_hook.py $T/cuda_tests/memory_hooks_tests $T/fft_tests/test_cache.py"
( cd .gpu_work/cupy && timeout "$(lim 90)" python3 -m pytest -q --rootdir=. -c pyproject.toml -p no:cacheprovider --junitxml="$R/plain.xml" $FILES > "$R/cupy-plain.log" 2>&1; echo "exit $?" >> "$R/cupy-plain.log" )
( cd .gpu_work/cupy && PYTHONPATH=$REPO timeout "$(lim 110)" python3 -m tracekit record -o "$R/cupy-tests.parquet" --force -m pytest -q --rootdir=. -c pyproject.toml -p no:cacheprovider --junitxml="$R/rec.xml" $FILES > "$R/cupy-rec.log" 2>&1; echo "exit $?" >> "$R/cupy-rec.log" )
python3 scripts/junit_compare.py "$R/plain.xml" "$R/rec.xml" > "$R/cupy-compare.json" 2>&1
python3 - "$R/cupy-tests.parquet" >> "$R/cupy-compare.json" 2>&1 <<'PY'
import json, sys
from tracekit.trace import Op, read_trace
t = read_trace(sys.argv[1])
print(json.dumps({"events": len(t.events), "mallocs": int((t.events.op == Op.MALLOC).sum()),
                  "segment_allocs": int((t.events.op == Op.SEGMENT_ALLOC).sum()),
                  "segment_frees": int((t.events.op == Op.SEGMENT_FREE).sum())}))
PY
rm -f "$R/cupy-tests.parquet"
pack

step "recorder gpu tests"
run pytest-gpu 200 python3 -m pytest -m gpu -q -rA -p no:cacheprovider \
  tests/gpu/test_record_gpu.py tests/gpu/test_record_gpu_v2.py tests/gpu/test_record_transparency_gpu.py \
  tests/gpu/test_record_stacks_gpu.py tests/gpu/test_record_depth_gpu.py
if [ -n "${BASE:-}" ]; then
  step "overhead A/B against $BASE"
  run ab "$(lim 260)" python3 scripts/bench_record_ab.py --base "$BASE" --rounds "${ROUNDS:-3}" \
    --steps "${STEPS:-1000}" --repeats 3 --json "$R/ab.json"
fi
step done
