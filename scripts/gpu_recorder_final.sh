#!/usr/bin/env bash
# On a GPU machine, after gpu_recorder_check.sh: the recorder's GPU tests, the overhead against an
# earlier tree (BASE=DIR, bench_record_ab.py), a slice of CuPy 14.2's own tests with and without
# recording (each test bounded by pytest-timeout, the runs by timeout -k: a test that hangs on the
# machine ends both runs alike), and `record --torch` against PyTorch's own history
# (bench_torch_record.py). ONE tarball $OUT/final.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 BASE=DIR bash scripts/gpu_recorder_final.sh
NAME=final
source "$(dirname "$0")/gpu_common.sh"
REPO=$(pwd)

step build
run build 60 python3 setup.py build_ext --inplace

step "recorder gpu tests"
run pytest-gpu 110 python3 -m pytest -m gpu -q -rA -p no:cacheprovider \
  tests/gpu/test_record_gpu.py tests/gpu/test_record_gpu_v2.py tests/gpu/test_record_transparency_gpu.py \
  tests/gpu/test_record_stacks_gpu.py tests/gpu/test_record_depth_gpu.py
pack

step "overhead A/B against $BASE"
run ab 170 python3 scripts/bench_record_ab.py --base "$BASE" --rounds 2 --steps 800 --repeats 3 --json "$R/ab.json"
pack

step "cupy test slice"
T=tests/cupy_tests
FILES="$T/cuda_tests/test_memory_hook.py $T/cuda_tests/memory_hooks_tests $T/fft_tests/test_cache.py $T/cuda_tests/test_stream.py"
OPTS="-q --rootdir=. -c pyproject.toml -p no:cacheprovider --timeout 30"
( cd .gpu_work/cupy && timeout -k 5 "$(lim 50)" python3 -m pytest $OPTS --junitxml="$R/plain.xml" $FILES > "$R/cupy-plain.log" 2>&1; echo "exit $?" >> "$R/cupy-plain.log" )
( cd .gpu_work/cupy && PYTHONPATH=$REPO timeout -k 5 "$(lim 60)" python3 -m tracekit record -o "$R/cupy-tests.parquet" --force -m pytest $OPTS --junitxml="$R/rec.xml" $FILES > "$R/cupy-rec.log" 2>&1; echo "exit $?" >> "$R/cupy-rec.log" )
python3 scripts/junit_compare.py "$R/plain.xml" "$R/rec.xml" > "$R/cupy-compare.json" 2>&1
rm -f "$R"/cupy-tests.parquet*
pack

step "record --torch against PyTorch's own history"
run torch 150 python3 scripts/bench_torch_record.py --steps 30 --repeats 3 --json "$R/torch.json"
step done
