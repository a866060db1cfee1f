#!/usr/bin/env bash
# Install tracekit into .venv (created if missing) and explain a real out-of-memory error recorded on
# an NVIDIA H200: the seed question's own case. The program asked for 512 MiB arrays on a 139.80 GiB
# GPU and ran out after 2 GiB, because another process held 133 GiB and one kernel had raised the
# stack limit, reserving 3.87 GiB of local memory. `analyze` says so with measured figures; `advise`
# works from the room the process really had and names the cure, with the line to paste.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TRACE=${1:-traces/cupy-seed.parquet}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
echo "== what was recorded: tracekit info $TRACE"
.venv/bin/tracekit info "$TRACE"
echo
echo "== why it ran out of memory: tracekit analyze $TRACE"
.venv/bin/tracekit analyze "$TRACE"
echo
echo "== what to change so it fits: tracekit advise $TRACE"
.venv/bin/tracekit advise "$TRACE"
