"""The compiled torch replay runs one signature whether the trace was read from a file or made in memory.

numba compiles a kernel once per argument types, and a read-only array (a column read from a
file) is another type than a writable one (advise's in-memory inputs). ``tracekit precompile``
builds the kernels at install by replaying files, so a second signature would be compiled on
the first ``advise`` (several seconds). Run in a fresh process: other tests compile their own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = """
from tracekit.advise.run import advise
from tracekit.sim.base import SimConfig
from tracekit.sim.engine import replay_file
from tracekit.sim.policies._torch_kernel import torch_replay
from tracekit.trace.reader import read_trace
replay_file("traces/torch-oom.parquet", "torch", SimConfig())
advise(read_trace("traces/torch-oom.parquet"), jobs=1)
print(len(torch_replay.signatures))
"""


def test_replay_and_advise_share_the_torch_kernel_signature() -> None:
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "1"
