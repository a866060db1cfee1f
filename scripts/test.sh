#!/usr/bin/env bash
# Install tracekit with its dev tools into .venv (created if missing), then run
# ruff, mypy and the whole test suite. GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[dev]"
.venv/bin/ruff check tracekit tests scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
