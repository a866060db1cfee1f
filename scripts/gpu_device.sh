#!/usr/bin/env bash
# Device replay and budget on a real GPU, end to end: budget (plain, --kernel-local-bytes 16384,
# --probe-largest), the device fragmentation measurement, device replay of the committed and of
# synthetic traces with each allocator (with and without --capacity, --compare-sim cupy), the
# capacity/OOM/release checks, the replay latency benchmark and the GPU tests.
# Usage: scripts/gpu_device.sh [OUT_DIR]   (default $OUT, else /tmp/tracekit-device)
# SECTIONS="budget fragmentation bench tests replay capacity" (the default: all) picks what runs.
# Writes only under OUT_DIR; everything ends up in OUT_DIR/device.tar.gz (the folder it was
# packed from is removed). Safe to re-run.
set -u
OUT_DIR=${1:-${OUT:-/tmp/tracekit-device}}
R="$OUT_DIR/device"
rm -rf "$R" && mkdir -p "$R/replays" "$R/synth" "$R/budget"
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
TK=(python3 -m tracekit)
START=$(date +%s)

SECTIONS=${SECTIONS:-budget fragmentation bench tests replay capacity}
want() { [[ " $SECTIONS " == *" $1 "* ]]; }
pack() { [ -d "$R" ] && tar czf "$OUT_DIR/device.tar.gz" -C "$OUT_DIR" device 2>/dev/null; }
trap pack EXIT
step() {  # step NAME TIMEOUT CMD...: run, keep stdout/stderr/rc/seconds, one summary line
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s.%N)
  timeout "$limit" "$@" >"$R/$name.out" 2>"$R/$name.err"
  local rc=$?
  local dt=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
  echo "$name rc=$rc ${dt}s" | tee -a "$R/steps.txt"
}

{ nvidia-smi; python3 -c "import cupy, numpy, pyarrow, sys; print(sys.version); print('cupy', cupy.__version__, \
'numpy', numpy.__version__, 'pyarrow', pyarrow.__version__); print(cupy.cuda.runtime.runtimeGetVersion(), \
cupy.cuda.runtime.driverGetVersion())"; git log --oneline -1; date -u; } >"$R/env.txt" 2>&1

# 1. budget, each in a fresh process so "before the context" is really before it
if want budget; then
  step budget_text 60 "${TK[@]}" budget
  step budget_json 60 "${TK[@]}" budget --json
  step budget_kernel_json 90 "${TK[@]}" budget --json --kernel-local-bytes 16384
  step budget_probe_json 90 "${TK[@]}" budget --json --probe-largest
  step budget_full_text 120 "${TK[@]}" budget --kernel-local-bytes 16384 --probe-largest
  pack
fi

# 2. does the device fragment?
if want fragmentation; then
  step fragmentation 90 python3 scripts/device_fragmentation.py --json "$R/fragmentation.json"
  pack
fi

# 3. speed: replay vs a bare loop of the same cudaMalloc/cudaFree calls
if want bench; then
  step bench 90 python3 scripts/bench_device_replay.py --events 100000 --json "$R/bench.json"
  pack
fi

# 4. tests
if want tests; then
  step pytest 150 python3 -m pytest -m gpu tests/*/test_device*.py tests/*/test_budget*.py -q -rfEs -p no:cacheprovider
  pack
fi

# 5. device replay: committed traces and synthetic ones, each allocator
if want replay; then
  for p in training random fragmenting; do
    "${TK[@]}" synth -p "$p" -n 100000 -s 3 -o "$R/synth/$p.parquet" 2>>"$R/synth.err"
  done
  for t in traces/cupy*.parquet "$R"/synth/*.parquet; do  # all committed traces: in the tests
    [ -e "$t" ] || continue
    b=$(basename "$t" .parquet)
    for a in cuda cupy cupy-async; do
      step "replay_${b}_${a}" 60 "${TK[@]}" replay "$t" --device 0 --allocator "$a" --json --continue-on-oom \
        -o "$R/replays/${b}_${a}.parquet"
    done
  done
fi

# 6. capacity: the OOM happens, --fail-on-oom exits 3, memory comes back ("released" in the JSON)
if want capacity; then
  for p in random fragmenting; do
    [ -e "$R/synth/$p.parquet" ] || "${TK[@]}" synth -p "$p" -n 100000 -s 3 -o "$R/synth/$p.parquet" 2>>"$R/synth.err"
  done
  for a in cuda cupy cupy-async; do
    step "capacity_fragmenting_${a}" 60 "${TK[@]}" replay "$R/synth/fragmenting.parquet" --device 0 --allocator "$a" \
      --capacity 512MiB --json --fail-on-oom
  done
  step capacity_refused 30 "${TK[@]}" replay "$R/synth/random.parquet" --device 0 --allocator cuda --capacity 100TiB
  for t in "$R"/synth/*.parquet; do
    b=$(basename "$t" .parquet)
    step "compare_${b}" 120 "${TK[@]}" replay "$t" --device 0 --allocator cupy --capacity 2GiB --compare-sim cupy
  done
  rm -f "$R"/replays/*random_cupy-async.parquet "$R"/replays/*training_cupy-async.parquet  # keep the tarball small
  pack
fi

echo "total $(( $(date +%s) - START ))s" | tee -a "$R/steps.txt"
pack
rm -rf "$R"
