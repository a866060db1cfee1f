"""--stack-depth over real CuPy counts frames from the program's line: CuPy's own never use it up."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_record_stacks_gpu import _record  # the real-CuPy recording helper (tests/gpu on the path)

from tracekit.trace import Op, read_trace
from tracekit.trace.stacks import FrameKind

pytestmark = pytest.mark.gpu

MINE = [(6, "inner"), (10, "middle"), (14, "outer"), (19, "<module>")]  # the helper's program


@pytest.mark.parametrize("depth", [1, 2])
def test_a_small_depth_keeps_cupy_s_frames_and_the_users_line(tmp_path: Path, depth: int) -> None:
    ev = read_trace(_record(tmp_path, "--stack-depth", str(depth)), strict=True).events
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    assert len(mallocs) >= 6
    for i in mallocs:
        frames = ev.stacks.frames(int(ev.stack[i]))
        first = next(k for k, f in enumerate(frames) if f.file == "app.py")
        assert first >= 1 and all(f.kind is FrameKind.LIBRARY and "cupy" in f.file for f in frames[:first])
        assert [(f.line, f.function) for f in frames[first:]] == MINE[:depth]
        assert ev.site_name(int(i)) == "app.py:6:inner"
