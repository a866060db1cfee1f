#!/usr/bin/env bash
# Install tracekit into .venv (created if missing) and explain the out-of-memory
# error in a real trace recorded on an NVIDIA H200 (CuPy pool, fragmentation).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
TRACE=${1:-traces/cupy-oom-frag.parquet}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e .
.venv/bin/tracekit info "$TRACE"
echo
.venv/bin/tracekit analyze "$TRACE"
