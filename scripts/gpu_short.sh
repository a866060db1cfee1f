#!/usr/bin/env bash
# One short device call for both open speed issues, most wanted first: the recorder's overhead against
# CuPy's no-op hook (issue 39: PROCS fresh processes x REPEATS x STEPS, variants shuffled), the
# libraries' import floor with and without one BLAS thread, start-up to the first read (no kernel
# needed), then the reader's kernels compiled and a 10M-event read (issue 45 item 1), without and
# with NumPy's huge pages the other way.
# ONE tarball $OUT/short.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=540 [PROCS=3] [REPEATS=3] [STEPS=3000] bash scripts/gpu_short.sh
NAME=short
source "$(dirname "$0")/gpu_common.sh"
TRACE=${TRACE_DIR:-/tmp/tracekit-host}/r10.parquet
mkdir -p "$(dirname "$TRACE")"

machine nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv

step "recorder overhead, fresh processes"
run build 60 python3 setup.py build_ext --inplace
if ! python3 -c "import tracekit.record._fastpath" 2>/dev/null; then  # a setuptools that refuses the pyproject
  B=$(mktemp -d); mkdir -p "$B/tracekit/record"; cp tracekit/record/_fastpath.c "$B/tracekit/record/"
  (cd "$B" && python3 -c "from setuptools import setup, Extension; setup(name='x', script_args=['build_ext', '--inplace'],
     ext_modules=[Extension('tracekit.record._fastpath', ['tracekit/record/_fastpath.c'])])") >> "$R/build.log" 2>&1
  cp "$B"/tracekit/record/_fastpath*.so tracekit/record/ >> "$R/build.log" 2>&1
fi
python3 -c "import tracekit.record.fastpath as f; print('compiled', f.COMPILED)" >> "$R/build.log" 2>&1
run fresh "${FRESH_S:-330}" python3 scripts/bench_record_fresh.py --processes "${PROCS:-3}" \
  --steps "${STEPS:-3000}" --repeats "${REPEATS:-3}" --shuffle --json "$R/fresh.json"
pack

import_floor 5 40

step "start-up to the first read"
run startup 40 python3 scripts/bench_startup.py --runs 5
pack

step "the reader's kernels, a 10M-event trace, its read"
run compile 90 python3 -c "from tracekit.trace.reader import read_trace; read_trace('traces/cupy-mlp.parquet')"
[ -f "$TRACE" ] || run synth 90 python3 -m tracekit synth --pattern random --events 10000000 -o "$TRACE"
run read 90 python3 scripts/bench_trace_io.py --read "$TRACE" --runs "${RUNS:-3}"
pack
step "the same read with NumPy's huge pages the other way (NUMPY_MADVISE_HUGEPAGE=$HUGE_ALT)"
run read-hugepages 90 env NUMPY_MADVISE_HUGEPAGE="$HUGE_ALT" python3 scripts/bench_trace_io.py --read "$TRACE" \
  --runs "${RUNS:-3}"
step done
