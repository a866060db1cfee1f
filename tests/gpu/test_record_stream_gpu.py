"""The stream of every recorded row on a real GPU, read through CuPy's own C function.

The compiled hook takes the current stream from ``cupy.cuda.stream.__pyx_capi__
['get_current_stream_ptr']`` (the function CuPy's pool keys its free lists by), not from
``get_current_stream().ptr``: the program says which stream each of its arrays was made on, and
every malloc and free row must carry that handle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Op, read_trace

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import json, sys
import cupy as cp
streams = [cp.cuda.Stream(non_blocking=True) for _ in range(3)]
made = []
x = cp.zeros(1 << 20, dtype=cp.uint8)  # the default stream
made.append((int(x.data.ptr), 0))
keep = [x]
for s in streams:
    with s:
        for k in range(4):
            a = cp.empty((k + 1) << 21, dtype=cp.uint8)
            made.append((int(a.data.ptr), int(s.ptr)))
            keep.append(a)
    s.synchronize()
json.dump(made, open(sys.argv[1], "w"))
"""


def test_every_row_carries_the_stream_its_array_was_made_on(tmp_path: Path) -> None:
    import cupy

    from tracekit.record.fastpath import COMPILED
    from tracekit.record.hook import stream_capsule

    if COMPILED:
        assert stream_capsule(cupy) is not None, "this CuPy exports no get_current_stream_ptr"
    app = tmp_path / "app.py"
    app.write_text(PROGRAM)
    witness, out = tmp_path / "made.json", tmp_path / "t.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "tracekit", "record", "-o", str(out), str(app), str(witness)],
                       capture_output=True, text=True, env=env, timeout=240)
    assert p.returncode == 0, p.stderr
    made = {ptr: stream for ptr, stream in json.loads(witness.read_text())}
    ev = read_trace(out, strict=True).events
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    got = {int(ev.addr[i]): int(ev.stream[i]) for i in mallocs if int(ev.addr[i]) in made}
    assert got == made  # every array found, each with its own stream
    assert len(set(made.values())) == 4
