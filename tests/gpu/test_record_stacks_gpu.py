"""Whole stacks recorded from real CuPy: CuPy's Python frame that asked, then the program's three."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Op, read_trace
from tracekit.trace.stacks import FrameKind

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
    import cupy as cp


    def inner(n):
        return cp.zeros(n, cp.float32)


    def middle(n):
        return inner(n)


    def outer(n):
        return middle(n)


    keep = []
    for k in range(10, 16):
        keep.append(outer(1 << k))
"""


def _record(tmp: Path, *opts: str) -> Path:
    (tmp / "app.py").write_text(textwrap.dedent(PROGRAM))
    out = tmp / "t.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "tracekit", "record", *opts, "-o", str(out), "app.py"],
                       capture_output=True, text=True, cwd=tmp, env=env, timeout=240)
    assert p.returncode == 0, p.stderr
    return out


def test_a_cupy_malloc_names_cupy_s_frame_then_the_program_s(tmp_path: Path) -> None:
    t = read_trace(_record(tmp_path), strict=True)
    ev = t.events
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    assert len(mallocs) >= 6 and np.all(ev.stack[ev.op == Op.FREE] == -1)
    for i in mallocs:
        frames = ev.stacks.frames(int(ev.stack[i]))
        assert frames[0].kind is FrameKind.LIBRARY and "cupy" in frames[0].file  # what asked: cupy.zeros
        mine = [(f.line, f.function) for f in frames if f.file == "app.py"]
        assert mine == [(6, "inner"), (10, "middle"), (14, "outer"), (19, "<module>")]
        assert frames[-1].function == "<module>"  # nothing of tracekit's launcher beyond the program
        assert ev.site_name(int(i)) == "app.py:6:inner"  # the one-frame site as it always was


def test_stack_depth_bounds_real_stacks(tmp_path: Path) -> None:
    t = read_trace(_record(tmp_path, "--stack-depth", "2"), strict=True)
    ev = t.events
    for i in np.flatnonzero(ev.op == Op.MALLOC):
        # the depth counts from the call-site (CuPy's own frames inside it never use it up)
        frames = ev.stacks.frames(int(ev.stack[i]))
        first = next(k for k, f in enumerate(frames) if f.file.endswith("app.py"))
        assert 1 <= len(frames) - first <= 2, [f.label() for f in frames]
