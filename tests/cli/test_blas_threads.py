"""Verbs that read traces, and worker processes, load NumPy with one BLAS thread, and leave the
environment as it was.

NumPy's OpenBLAS starts one thread per core when it is loaded unless ``OPENBLAS_NUM_THREADS`` says
otherwise (``tracekit.blas`` says why). Each case runs in a fresh interpreter, where NumPy is not
loaded yet; a thread count of the process tells how many threads loading NumPy started."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="counts threads in /proc (Linux)")

VERB = r"""
import json, os, sys
before = len(os.listdir("/proc/self/task"))
from tracekit.cli.app import one_blas_thread_for
one_blas_thread_for(sys.argv[1:])
import numpy
print(json.dumps({"added_threads": len(os.listdir("/proc/self/task")) - before,
                  "env": os.environ.get("OPENBLAS_NUM_THREADS")}))
"""

WORKER = r"""
import json, os
from tracekit.workers import Pool

def threads_and_env(_):
    import numpy  # loaded by the worker's start already
    return len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS")

if __name__ == "__main__":
    pool = Pool(2)
    try:
        got = [r for _, r in pool.each(threads_and_env, [(0,), (1,)], on_error=lambda i, e: None)]
    finally:
        pool.close()
    print(json.dumps(got))
"""


def python(code: str, *argv: str, env: dict[str, str] | None = None, cwd: str | None = None) -> object:
    run_env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | (env or {})
    out = subprocess.run([sys.executable, "-c", code, *argv], env=run_env, capture_output=True, text=True,
                         check=True, cwd=cwd)
    return json.loads(out.stdout)


def test_a_reading_verb_loads_numpy_without_blas_threads_and_puts_the_environment_back() -> None:
    assert python(VERB, "replay", "t.parquet") == {"added_threads": 0, "env": None}
    assert python(VERB, "--no-color", "analyze", "t.parquet") == {"added_threads": 0, "env": None}


def test_record_and_a_value_the_user_set_are_left_alone() -> None:
    assert python(VERB, "record", "app.py")["env"] is None  # type: ignore[index]
    assert python(VERB, "replay", "t.parquet", env={"OPENBLAS_NUM_THREADS": "3"})["env"] == "3"  # type: ignore[index]


def test_worker_processes_load_numpy_with_one_blas_thread(tmp_path: object) -> None:
    """A worker of the one pool (fleet's) runs its tasks on its main thread alone: NumPy started no
    BLAS thread there, and the worker's environment is as the parent's."""
    script = os.path.join(str(tmp_path), "workers_blas.py")
    with open(script, "w") as f:
        f.write(WORKER)
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"})
    assert json.loads(out.stdout) == [[1, None], [1, None]]
