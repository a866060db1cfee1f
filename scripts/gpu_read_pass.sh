#!/usr/bin/env bash
# On a device machine's 16-core host, one call: issue 45's read (bench_trace_io.py --read) with the
# reader's pass in C (tracekit.trace._readpass) beside numba's (TRACEKIT_READ_PASS=numba),
# interleaved fresh processes; then whole `replay --sim best-fit` and `analyze` of the same 10M
# events both ways, and start-up to the first read (bench_startup.py). Where the machine is an
# H200, issue 39's overhead measurement last. ONE tarball $OUT/read_pass.tar.gz.
#   OUT=/some/empty/dir BUDGET_S=560 bash scripts/gpu_read_pass.sh
NAME=read_pass
source "$(dirname "$0")/gpu_common.sh"

host_info
step build
run build 60 python3 setup.py build_ext --inplace
python3 -c "import tracekit.trace.readpass as r; print('C pass', r.COMPILED)" >> "$R/build.log" 2>&1
step synth
run synth 60 python3 -m tracekit synth -p random -n 10000000 --seed 1 -o "$WORK/r10m.parquet"
step compile
run compile 150 bash -c "python3 -m tracekit replay $WORK/r10m.parquet --sim best-fit; python3 -m tracekit analyze $WORK/r10m.parquet > /dev/null; TRACEKIT_READ_PASS=numba python3 -m tracekit info $WORK/r10m.parquet"
step read
run read 120 python3 scripts/bench_trace_io.py --read "$WORK/r10m.parquet" --pass-ab --runs "${RUNS:-5}"
pack
step whole
run whole 150 bash -c "for i in 1 2 3; do for how in '' numba; do for verb in 'replay --sim best-fit' analyze; do s=\$(date +%s.%N); TRACEKIT_READ_PASS=\$how python3 -m tracekit \$verb $WORK/r10m.parquet > /dev/null; e=\$(date +%s.%N); echo \"pass=\${how:-C} \$verb \$(python3 -c \"print(round(\$e - \$s, 3))\")\"; done; done; done"
pack
step startup
run startup 60 python3 scripts/bench_startup.py
pack
REPEATS=${REPEATS:-2} overhead_on_h200
step done
