"""Verbs that read traces load NumPy with one BLAS thread, and leave the environment as it was.

NumPy's OpenBLAS starts one thread per core when it is loaded unless ``OPENBLAS_NUM_THREADS`` says
otherwise (``tracekit.cli.app.load_numpy_with_one_blas_thread`` says why). Each case runs in a fresh
interpreter, where NumPy is not loaded yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, os, sys
before = len(os.listdir("/proc/self/task"))
from tracekit.cli.app import load_numpy_with_one_blas_thread
load_numpy_with_one_blas_thread(sys.argv[1:])
import numpy
print(json.dumps({"added_threads": len(os.listdir("/proc/self/task")) - before,
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""


def probe(*argv: str, env: dict[str, str] | None = None) -> dict[str, object]:
    run_env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | (env or {})
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], env=run_env, capture_output=True, text=True,
                         check=True)
    got: dict[str, object] = json.loads(out.stdout)
    return got


pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="counts threads in /proc (Linux)")


def test_a_reading_verb_loads_numpy_without_blas_threads_and_puts_the_environment_back() -> None:
    assert probe("replay", "t.parquet") == {"added_threads": 0, "env": None}
    assert probe("--no-color", "analyze", "t.parquet") == {"added_threads": 0, "env": None}


def test_record_and_a_value_the_user_set_are_left_alone() -> None:
    assert probe("record", "app.py")["env"] is None  # record runs the user's program: NumPy as it loads
    assert probe("replay", "t.parquet", env={"OPENBLAS_NUM_THREADS": "3"})["env"] == "3"
