"""Whole stacks on real recordings: what the H200 recorded agrees with the one-frame call-sites.

``traces/cupy-oom-frag-stacks.parquet`` is ``scripts/record_workloads.py oom`` recorded with whole
stacks (format 3); the PyTorch traces carry their snapshots' stacks (``scripts/add_stacks_to_fixtures.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Op, read_trace
from tracekit.trace.callsite import CallSites

TRACES = Path(__file__).resolve().parents[2] / "traces"


def test_a_cupy_recording_names_the_program_and_cupy_in_every_malloc_stack() -> None:
    t = read_trace(TRACES / "cupy-oom-frag-stacks.parquet")
    ev = t.events
    assert t.meta.schema_version == 3
    mallocs = np.flatnonzero((ev.op == Op.MALLOC) | (ev.op == Op.OOM))
    assert len(mallocs) and bool(np.all(ev.stack[mallocs] >= 0))
    cs = CallSites.of(ev.stacks)
    for i in mallocs.tolist():
        frames = ev.stacks.frames(int(ev.stack[i]))
        assert frames[-1].function == "<module>" and frames[-1].file == "scripts/record_workloads.py"
        # the one-frame site (innermost outside CuPy) is the user's frame of the whole stack
        user = cs.user_site(int(cs.of_events(ev.stack[i : i + 1])[0]))
        assert user == ev.site_name(i), (i, user, ev.site_name(i))


@pytest.mark.parametrize("name", ["torch-handled-oom", "torch-gpt2-lengths", "torch-resnet-fraction"])
def test_record_torch_stacks_start_at_the_program(name: str) -> None:
    t = read_trace(TRACES / f"{name}.parquet")
    ev = t.events
    used = np.unique(ev.stack[ev.stack >= 0])
    assert len(used)
    outermost = {ev.stacks.frames(int(s))[-1].file for s in used.tolist()}
    # the launcher (runpy, typer, tracekit) is cut: every stack starts in the recorded program
    assert all(f.startswith("scripts/") for f in outermost), outermost
