# Set-up shared by the GPU scripts (scripts/gpu_NAME.sh); each sets NAME, then sources this file:
#   NAME=rec; source "$(dirname "$0")/gpu_common.sh"
# It goes to the repository root, takes the output folder from $OUT (else the script's $1, else
# ./out), exports PYTHONPATH=. and PYTHONUNBUFFERED, and makes a temporary folder $WORK whose
# $R (= $WORK/$NAME) receives everything the script writes. On every way out (also after a
# failure or a timeout) $R is packed as ONE tarball $OUT/$NAME.tar.gz and $WORK removed; a script
# may call `pack` earlier too, so a killed run still leaves its last snapshot, and may define
# `before_pack` (say, to drop files too large to come back). BUDGET_S (default 240) bounds the
# run: END is when the steps must have finished, leaving a margin for packing.
#   step TEXT...           a heading in $R/steps.log, with the clock and the seconds left
#   lim SECONDS            SECONDS, or what is left of the budget if that is less (at least 3)
#   left                   the seconds left before END
#   run NAME LIMIT CMD...  CMD within lim LIMIT, its output in $R/NAME.log ending with its exit code
#   import_floor RUNS LIMIT  the libraries' import floor with and without one BLAS thread at load
#                          (probe_import_floor.py) and NumPy's -X importtime both ways, into $R
#   machine [CMD...]       the machine described in $R/machine.txt (CPUs, Python, huge pages, the
#                          balloon's free page reporting), then CMD's output (say, nvidia-smi)
#   host_info              the GPU's name, the CPUs and the uptime in $R/host.log (a step of its own)
#   on_h200                true where host_info found an H200
#   overhead_on_h200 [KEEP]  issue 39's overhead measurement (bench_record_fresh.py --shuffle, CuPy MLP,
#                          3,000 steps, $PROCESSES x $REPEATS, default 4 x 3) where the machine is an
#                          H200, leaving KEEP seconds (default 0) of the budget for what follows
#   HUGE_ALT               NumPy's huge pages the other way from the verbs' own choice
#                          (tracekit.numpy_setup), for an A/B: NUMPY_MADVISE_HUGEPAGE=$HUGE_ALT
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${NAME:?set NAME before sourcing gpu_common.sh}"
OUT=${OUT:-${1:-out}}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH}
BUDGET_S=${BUDGET_S:-240}
PACK_MARGIN_S=12
END=$(( $(date +%s) + BUDGET_S - PACK_MARGIN_S ))
WORK=$(mktemp -d)
R="$WORK/$NAME"
mkdir -p "$R"

before_pack() { :; }
pack() {
  before_pack
  tar czf "$OUT/$NAME.tar.gz" -C "$WORK" "$NAME"
}
_gpu_common_exit() {
  local rc=$?
  pack
  rm -rf "$WORK"
  ls -l "$OUT"
  exit "$rc"
}
trap _gpu_common_exit EXIT
trap 'exit 143' TERM  # a signal ends the script through the EXIT trap, so the tarball is still written
trap 'exit 130' INT
left() { echo $(( END - $(date +%s) )); }
lim() { local l; l=$(left); (( l < 3 )) && l=3; (( l < $1 )) && echo "$l" || echo "$1"; }
step() { echo "== $* ($(date -u +%H:%M:%S), $(left) s left)" | tee -a "$R/steps.log"; }
run() {
  local name=$1 limit=$2; shift 2
  timeout "$(lim "$limit")" "$@" > "$R/$name.log" 2>&1
  echo "exit code $?" >> "$R/$name.log"
}
import_floor() {
  step "the libraries' import floor, with and without one BLAS thread at load"
  run floor "$2" python3 scripts/probe_import_floor.py --runs "$1"
  python3 -X importtime -c "import numpy" 2> "$R/numpy-importtime.txt"
  OPENBLAS_NUM_THREADS=1 python3 -X importtime -c "import numpy" 2> "$R/numpy-importtime-1thread.txt"
  pack
}
host_info() {
  step host
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nproc; uptime; } > "$R/host.log" 2>&1
}
on_h200() { grep -q H200 "$R/host.log"; }
overhead_on_h200() {
  on_h200 || return 0
  step "issue 39: fresh processes"
  run fresh "$(( $(left) - ${1:-0} ))" python3 scripts/bench_record_fresh.py --processes "${PROCESSES:-4}" \
    --steps 3000 --repeats "${REPEATS:-3}" --shuffle --json "$R/fresh.json"
  pack
}
machine() {
  step machine
  { nproc; lscpu | grep -i "model name"; uptime; python3 --version
    cat /sys/kernel/mm/transparent_hugepage/enabled /sys/bus/virtio/drivers/virtio_balloon/virtio*/features
    python3 -c "from tracekit.numpy_setup import free_pages_reported as f; print('free pages reported', f())"
    [ $# -gt 0 ] && "$@"; } > "$R/machine.txt" 2>&1
}
HUGE_ALT=$(python3 -c "from tracekit.numpy_setup import free_pages_reported as f; print(int(f()))")
