"""Imported by each local engine worker as it starts, so it has the analyzer loaded before its first trace.

Importing the analyzer (NumPy, pyarrow, numba, tracekit) and loading its
compiled kernels from numba's cache takes about a second per process, more
than the analysis of a trace of a few hundred thousand events. The local
engine names this module to its ``tracekit.workers.Pool`` (``imports``):
each worker imports it once, which analyzes a six-event trace built in
memory (a segment, blocks, a free, a failing request: the pooled scan and
the OOM report both run), so the kernels are loaded once per long-lived
worker, in parallel. No file is read here.
"""

from __future__ import annotations

import contextlib

import numpy as np

from tracekit.analysis import analyze_trace
from tracekit.trace import Events, Op, Source, Trace, TraceMeta
from tracekit.trace.validate import pair_events


def warm() -> None:
    """Run the analyzer once on a tiny in-memory trace so its kernels are loaded."""
    mib = 1 << 20
    ops = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM, Op.SEGMENT_FREE], np.int8)
    size = np.array([4 * mib, mib, mib, mib, 4 * mib, 4 * mib], np.uint64)
    addr = np.array([1 << 40, 1 << 40, (1 << 40) + mib, 1 << 40, 0, 1 << 40], np.uint64)
    ev = Events.build(ops, size, addr=addr, rounded=size)
    pairing = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    analyze_trace(Trace(None, TraceMeta(Source.SYNTHETIC), ev, pairing.mate, None, ()), timeline=False)


# Only a head start: should it fail, each worker loads the kernels itself and reports real errors.
with contextlib.suppress(Exception):
    warm()
