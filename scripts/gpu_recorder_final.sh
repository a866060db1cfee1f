#!/usr/bin/env bash
# On a GPU machine: the recorder and the pytest plugin against real CuPy and PyTorch. ONE tarball
# $OUT/final.tar.gz. In order of what matters most, so a run cut short keeps the first steps:
#   - the compiled fast path built in place (python3 setup.py build_ext --inplace);
#   - the overhead of this tree against an earlier one (BASE=DIR, bench_record_ab.py: interleaved
#     fresh processes, each one's ratios to CuPy's no-op hook measured side by side);
#   - scripts/gpu_identity.py: every attribute of CuPy's memory modules, with and without recording;
#   - the recorder's and the pytest plugin's GPU tests;
#   - a slice of CuPy 14.2's own tests (copied from CuPy's source repository into .gpu_work/cupy,
#     not committed) plain, under `tracekit record`, and under the plugin's --gpu-memory, each test
#     bounded by pytest-timeout and the runs by timeout -k, compared by scripts/junit_compare.py;
#   - scripts/gpu_ends.py: every way a recorded program can end.
#   OUT=/some/empty/dir BUDGET_S=560 BASE=DIR [SLICE=0] [AB=0] [IDENTITY=0] [TESTS=0] [ENDS=0] [H200=1] \
#     bash scripts/gpu_recorder_final.sh
NAME=final
source "$(dirname "$0")/gpu_common.sh"
REPO=$(pwd)
before_pack() { rm -rf "$R/ends"; }

host_info
step build
run build 60 python3 setup.py build_ext --inplace
# the earlier tree compiled too (where it has a setup.py), so the A/B compares like with like
[ -n "${BASE:-}" ] && [ -f "$BASE/setup.py" ] && (cd "$BASE" && TRACEKIT_NO_PRECOMPILE=1 python3 setup.py build_ext --inplace) >> "$R/build.log" 2>&1
[ -n "${BASE:-}" ] && PYTHONPATH=$BASE python3 -c "import tracekit.record.fastpath as f; print('base compiled', f.COMPILED)" >> "$R/build.log" 2>&1
python3 -c "import tracekit.record.fastpath as f; print('compiled', f.COMPILED, f.Hook)" >> "$R/build.log" 2>&1

# H200=1: issue 39's measurement first where the machine is an H200 (gpu_common.sh), leaving KEEP_H200 s
[ "${H200:-0}" = 1 ] && overhead_on_h200 "${KEEP_H200:-240}"

if [ "${AB:-1}" = 1 ]; then  # AB=0: no A/B (the overhead measured by gpu_overhead_fresh.sh instead)
step "overhead A/B against $BASE"
run ab "${AB_S:-200}" python3 scripts/bench_record_ab.py --base "$BASE" --rounds "${ROUNDS:-5}" \
  --steps "${STEPS:-3000}" --repeats "${REPEATS:-3}" --json "$R/ab.json"
pack
fi

if [ "${IDENTITY:-1}" = 1 ]; then
step identity
for mode in none plain async; do
  timeout "$(lim 40)" python3 scripts/gpu_identity.py $mode >> "$R/identity.jsonl" 2>>"$R/identity.err"
done

fi

if [ "${TESTS:-1}" = 1 ]; then
step "recorder and plugin gpu tests"
run pytest-gpu 150 python3 -m pytest -m gpu -q -rA -p no:cacheprovider \
  tests/gpu/test_pytest_plugin_gpu.py tests/gpu/test_record_gpu.py tests/gpu/test_record_gpu_v2.py \
  tests/gpu/test_record_stacks_gpu.py tests/gpu/test_record_depth_gpu.py tests/gpu/test_record_stream_gpu.py
pack

fi

if [ "${SLICE:-1}" = 1 ]; then  # SLICE=0: no CuPy test slice (the recorder's transparency unchanged)
step "cupy test slice"
T=tests/cupy_tests
FILES="$T/cuda_tests/test_memory_hook.py $T/cuda_tests/memory_hooks_tests $T/fft_tests/test_cache.py $T/cuda_tests/test_stream.py"
OPTS="-q --rootdir=. -c pyproject.toml -p no:cacheprovider"
python3 -c "import pytest_timeout" 2>/dev/null && OPTS="$OPTS --timeout 30"
( cd .gpu_work/cupy && timeout -k 5 "$(lim 45)" python3 -m pytest $OPTS --junitxml="$R/plain.xml" $FILES > "$R/cupy-plain.log" 2>&1; echo "exit $?" >> "$R/cupy-plain.log" )
( cd .gpu_work/cupy && PYTHONPATH=$REPO timeout -k 5 "$(lim 55)" python3 -m tracekit record -o "$R/cupy-tests.parquet" --force -m pytest $OPTS --junitxml="$R/rec.xml" $FILES > "$R/cupy-rec.log" 2>&1; echo "exit $?" >> "$R/cupy-rec.log" )
( cd .gpu_work/cupy && PYTHONPATH=$REPO timeout -k 5 "$(lim 55)" python3 -m pytest $OPTS -p tracekit.pytest.plugin --gpu-memory --junitxml="$R/plugin.xml" $FILES > "$R/cupy-plugin.log" 2>&1; echo "exit $?" >> "$R/cupy-plugin.log" )
python3 scripts/junit_compare.py "$R/plain.xml" "$R/rec.xml" > "$R/cupy-compare.json" 2>&1
python3 scripts/junit_compare.py "$R/plain.xml" "$R/plugin.xml" > "$R/cupy-compare-plugin.json" 2>&1
rm -f "$R"/cupy-tests.parquet*
pack
fi

[ "${ENDS:-1}" = 1 ] || exit 0
step ends
run ends 100 python3 scripts/gpu_ends.py "$R/ends"
pack

step "per-call parts"
run parts 90 python3 scripts/bench_record_parts.py --steps "${PARTS_STEPS:-600}" --repeats 3 --json "$R/parts.json"
step done
