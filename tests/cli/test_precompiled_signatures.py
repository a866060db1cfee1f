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

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
from tracekit.advise.run import advise
from tracekit.sim.base import SimConfig
from tracekit.advise.replay import replay_file
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


LAYOUTS = """
import numpy as np
from tracekit.analysis import analyze_trace
from tracekit.analysis import largest_free as lf
from tracekit.trace import Events, TraceMeta, Source, read_trace
from tracekit.trace.writer import TraceWriter
from tracekit.trace._kernels import pass_until_full
one = read_trace("traces/cupy-mlp.parquet")  # one row group: columns read zero-copy
ev = one.events
w = TraceWriter("{tmp}/groups.parquet", one.meta, row_group_size=4096)  # several: concatenated
w.write(ev)
w.close()
many = read_trace("{tmp}/groups.parquet")
built = Events.build(np.array(ev.op), np.array(ev.size), addr=np.array(ev.addr),
                     rounded=np.array(ev.rounded), t_ns=np.array(ev.t_ns), stream=np.array(ev.stream))
for t in (one, many):
    analyze_trace(t)
print(len(lf.scan.signatures), len(pass_until_full.signatures), all(not getattr(built, f).flags.writeable
      for f in ("op", "size", "addr")))
"""


def test_every_file_layout_reaches_the_same_kernels(tmp_path: Path) -> None:
    # One row group is read zero-copy (read-only columns), several are concatenated (writable):
    # Events are read-only either way, so a big trace runs the kernels the install compiled.
    p = subprocess.run([sys.executable, "-c", LAYOUTS.format(tmp=tmp_path)], capture_output=True,
                       text=True, cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["1", "1", "True"]


def test_events_stay_read_only_across_a_pickle() -> None:
    # A trace pickled (to a worker process, a Ray task) must reach the kernels read-only again.
    import pickle

    import numpy as np

    from tracekit.trace import Events, Op

    ev = Events.build(np.array([Op.MALLOC, Op.FREE], np.int8), np.array([512, 512], np.uint64),
                      addr=np.array([4096, 4096], np.uint64), sites=("a.py:1:f",))
    back = pickle.loads(pickle.dumps(ev))
    assert not back.size.flags.writeable and not back.op.flags.writeable
    assert back.sites == ("a.py:1:f",) and back.size.tolist() == [512, 512]
