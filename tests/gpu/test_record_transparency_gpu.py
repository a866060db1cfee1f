"""On a GPU: programs that reach CuPy's pools in every way a program can, recorded and not.

Runs ``scripts/gpu_transparency.py`` (the whole suite, CuPy's examples included, is
``scripts/gpu_transparency.sh``) on the programs written for the pool kinds and the lazily
imported compiled modules: output and exit code equal with and without ``tracekit record``, and
every malloc and free of the trace equal to an independent ``MemoryHook`` in the same process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ["eigh", "fft-plan-cache", "sparse", "pool-subclass", "set-allocator", "async-pool", "thread-pool",
            "oom-under-limit", "fork", "closerange"]


@pytest.mark.gpu
def test_recorded_programs_are_their_own_and_every_event_is_the_hooks(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_transparency.py"), str(tmp_path),
                        "--only", *PROGRAMS], capture_output=True, text=True, timeout=600, cwd=ROOT)
    results = json.loads((tmp_path / "transparency.json").read_text())
    # The suite runs its cases in its own order; every one asked for must be there.
    assert sorted(r["name"] for r in results) == sorted(PROGRAMS), p.stderr[-3000:]
    for r in results:
        assert r["exit_same"] and r["stdout_same_masked"] and r["stderr_same_masked"], r
        # a case whose trace could not be compared (no witness, ``compare_error``) lacks the counts:
        # it fails here with its whole result, not on a missing key
        assert r["trace_written"] and r.get("trace_checked") and "compare_error" not in r, r
        assert r["mallocs_equal"] and r["frees_in_witness"] and r["ooms_equal"], r
    by = {r["name"]: r for r in results}
    assert by["oom-under-limit"]["rec_exit"] == 1 and by["async-pool"]["async_rows"] > 0
