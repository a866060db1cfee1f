#!/usr/bin/env bash
# Install tracekit with its dev tools into .venv (created if missing), then run
# ruff, mypy and the whole test suite. GPU tests skip themselves without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# The report tests open the HTML in headless Chromium (Debian's package); they skip,
# saying why, where it cannot be installed.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "warning: could not install chromium; the browser tests will be skipped" >&2
fi
.venv/bin/python -m pip install -q --upgrade pip
# polars (tracekit fleet's table) is the fleet extra; a failure here stops set-up. One install, so
# the build compiles the kernels once.
.venv/bin/python -m pip install -q -e ".[dev,fleet]"
# Ray (the fleet's cluster engine) has no wheel for every platform; its tests skip, saying why,
# where it cannot be installed, so set-up goes on without it.
.venv/bin/python -m pip install -q -e ".[ray]" \
  || echo "warning: could not install Ray (tracekit[ray]); the Ray tests will be skipped" >&2
.venv/bin/ruff check tracekit tests scripts
.venv/bin/mypy
.venv/bin/python -m pytest -q "$@"
