"""The spool's tail (``tracekit.record.tail``): rows mirrored into a shared ring, read back from the
spool's row count on, in order, by whoever finishes a spool its process left."""

from __future__ import annotations

import time
import types
from pathlib import Path

import numpy as np
import pytest

from tracekit.record import fastpath
from tracekit.record.hook import ROW, EventBuffer, TraceHook
from tracekit.record.recover import recover
from tracekit.record.spool import SpoolWriter
from tracekit.record.tail import Tail, read_tail, tail_path
from tracekit.trace import Op, Source, TraceMeta, read_trace

pytestmark = pytest.mark.skipif(not fastpath.COMPILED, reason="the ring needs the compiled helper "
                                "(tracekit.record._fastpath, built by pip install -e . with a C compiler)")
STREAM = types.SimpleNamespace(ptr=0)
BASE = 0x7F00_0000_0000


def _malloc(hook: TraceHook, i: int) -> None:
    hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=BASE + i * 512,  # type: ignore[misc]
                            pmem_id=i)


def test_the_rows_after_the_last_spool_write_come_back_from_the_ring(tmp_path: Path) -> None:
    """A process that dies after 30 rows of which 20 were written: recover makes all 30, in order."""
    spool = tmp_path / "t.parquet.spool"
    buf = EventBuffer()
    tail = Tail.open(tail_path(spool), 64)
    assert tail is not None
    buf.mirror(tail.ring)
    hook = TraceHook(buf, sites=None, current_stream=lambda: STREAM)
    w = SpoolWriter(spool, TraceMeta.new(Source.CUPY), buf, None, time.perf_counter_ns(), interval=3600.0)
    for i in range(20):
        _malloc(hook, i)
    w.flush()  # what the spool's writes hold
    for i in range(20, 30):
        _malloc(hook, i)  # only in the process's list, and in the ring
    w.detach()  # the process "dies": nothing more is written, no END frame
    tail.close()
    t = read_trace(recover(spool), strict=True)
    assert ((t.events.addr[t.events.op == Op.MALLOC] - BASE) // 512).tolist() == list(range(30))
    assert t.meta.extra["tail_rows"] == 10 and t.meta.extra["tail_rows_lost"] == 0
    assert not tail_path(spool).exists()


def test_a_ring_lapped_past_the_spool_says_how_many_rows_neither_holds(tmp_path: Path) -> None:
    path = tmp_path / "x.tail"
    tail = Tail.open(path, 8)
    assert tail is not None
    rows = fastpath.Rows(ROW)
    rows.mirror(tail.ring)
    for i in range(20):
        rows.extend((i, *range(1, ROW)))
    tail.close()
    got, lost = read_tail(path, since=5)
    assert got[:, 0].tolist() == list(range(12, 20)) and lost == 7  # rows 5..11 were overwritten
    got, lost = read_tail(path, since=15)
    assert got[:, 0].tolist() == list(range(15, 20)) and lost == 0
    path.write_bytes(b"not a ring")
    got, lost = read_tail(path, since=0)
    assert got.shape == (0, ROW) and lost == 0
    assert read_tail(tmp_path / "missing", 0)[0].shape == (0, ROW)
    assert np.all(np.diff(read_tail(tmp_path / "missing", 0)[0][:, 0]) == 1)
