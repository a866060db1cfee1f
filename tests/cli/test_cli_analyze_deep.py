"""``analyze`` on hostile whole stacks (format v3): a deep OOM stack is shown by its two ends."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace
from tracekit.trace.callsite import STACK_INNER, STACK_OUTER
from tracekit.trace.stacks import FrameKind, StackTable

MiB = 1 << 20
DEEP = 20_000
runner = CliRunner()


def deep_table(n: int) -> StackTable:
    """Stack i = frame m{i}.py:{i} called from stack i - 1 (the outermost is m0.py)."""
    return StackTable.build([f"m{i}.py" for i in range(n)], range(n), ["f"] * n, [int(FrameKind.USER)] * n,
                            range(n), np.arange(n) - 1)


@pytest.fixture
def deep_trace(tmp_path: Path) -> Path:
    """A 4 MiB pool: 3 MiB live at the innermost of a DEEP-deep chain, then a 2 MiB request there fails."""
    S = 0x7F00_0000_0000
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.OOM])
    size = np.array([4, 3, 2], np.uint64) * MiB
    ev = Events.build(op, size, addr=np.array([S, S, 0], np.uint64), rounded=size,
                      site=np.full(3, -1, np.int32), stack=np.array([-1, DEEP - 1, DEEP - 1], np.int32),
                      stacks=deep_table(DEEP))
    meta = TraceMeta.new(Source.CUPY, pool_limit_bytes=4 * MiB, device=DeviceInfo("H200", 80 << 30, 79 << 30))
    return write_trace(tmp_path / "deep.parquet", meta, ev)


def test_a_deep_oom_stack_keeps_its_two_ends(deep_trace: Path) -> None:
    r = runner.invoke(app, ["analyze", str(deep_trace), "--json"])
    assert r.exit_code == 0, r.output
    o = json.loads(r.stdout)["oom"]
    want = [f"m{i}.py:{i}:f" for i in range(DEEP - 1, DEEP - 1 - STACK_INNER, -1)] + \
        [f"m{i}.py:{i}:f" for i in range(STACK_OUTER - 1, -1, -1)]
    assert o["stack"] == want
    assert o["stack_left_out"] == DEEP - STACK_INNER - STACK_OUTER
    assert len(r.stdout) < 100_000  # the whole stack: about 250 kB
