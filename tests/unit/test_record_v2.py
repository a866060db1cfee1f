"""Version-2 recordings without a GPU: pools and devices resolved from segments, oom_states, exit.

The rows are made the way the recorder makes them (``HookedSegments`` for each
pool's device allocations, ``TraceHook`` for CuPy's malloc/free callbacks)
and written through the spool and ``finalize``, so every step but CuPy
itself runs. Two pools on two devices share nothing but the address space,
as under CUDA's unified addressing.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.record.device_alloc import HookedSegments
from tracekit.record.hook import EventBuffer, TraceHook
from tracekit.record.recover import finalize, recover
from tracekit.record.resolve import SegmentIndex
from tracekit.record.session import oom_note
from tracekit.record.spool import SpoolWriter
from tracekit.trace import Op, Source, TraceMeta, read_trace

STREAM = types.SimpleNamespace(ptr=0)
MiB = 1 << 20
DEV0, DEV1 = 0x7F00_0000_0000, 0x7E00_0000_0000  # one segment range per device


class OomError(MemoryError):
    pass


def _setup(tmp: Path, device: list[int]):  # type: ignore[no-untyped-def]
    buf = EventBuffer()
    state = {"device": 1, "mem_free": 117 * MiB, "mem_total": 140 << 30,
             "processes": [{"pid": 4242, "name": "python", "used_bytes": 133 << 30, "self": False}],
             "limits": {"stack_size": 16384, "malloc_heap_size": 8 * MiB, "printf_fifo_size": MiB},
             "pool": {"used_bytes": 250 * MiB, "total_bytes": 250 * MiB, "limit_bytes": 256 * MiB}}
    hook = TraceHook(buf, sites=None, current_stream=lambda: STREAM, current_device=lambda: device[0],
                     oom_state=lambda d: (1, dict(state, device=d)))
    next_ptr = {0: DEV0, 1: DEV1}

    class Pool:
        """A pool's device allocations as CuPy's hook shows them (``malloc``: alloc_postprocess)."""

        def __init__(self, pool_id: int) -> None:
            self.log = HookedSegments(buf, pool_of=lambda d: (pool_id + d, None), alive=lambda p: True,
                                      total_of=lambda pool, d: 0, current_stream=lambda: STREAM,
                                      free_bytes=lambda d: (1000 - d) * MiB)

        def malloc(self, size: int, d: int) -> int:
            ptr = next_ptr[d]
            next_ptr[d] += size
            self.log.before_alloc(d, size)
            self.log.after_alloc(d, size, ptr)
            return ptr

    def seg_log(pool_id: int) -> Pool:
        return Pool(pool_id)

    w = SpoolWriter(tmp / "t.parquet.spool", TraceMeta.new(Source.CUPY), buf, None, 0)
    return buf, hook, seg_log, w


def test_two_devices_blocks_take_their_segments_pool_and_device(tmp_path: Path) -> None:
    device = [0]
    _, hook, seg_log, w = _setup(tmp_path, device)
    pool = seg_log(0)  # pool ids: 0 on device 0, 1 on device 1
    s0 = pool.malloc(2 * MiB, 0)
    hook.malloc_postprocess(device_id=0, size=1000, mem_size=1024, mem_ptr=s0, pmem_id=1)  # type: ignore[misc]
    device[0] = 1
    s1 = pool.malloc(40 * MiB, 1)
    # CuPy 14 says device 0 for device 1's pool: the current device is written and the row counted
    hook.malloc_postprocess(device_id=0, size=40 * MiB, mem_size=40 * MiB, mem_ptr=s1, pmem_id=2)  # type: ignore[misc]
    hook.free_postprocess(device_id=1, mem_size=40 * MiB, mem_ptr=s1, pmem_id=2)  # type: ignore[misc]
    try:
        raise OomError("Out of memory allocating 62,914,560 bytes (allocated so far: 255,852,544 bytes, "
                       "limit set to: 268,435,456 bytes).")
    except MemoryError as e:
        hook.malloc_postprocess(device_id=0, size=60 * MiB, mem_size=60 * MiB, mem_ptr=0, pmem_id=0)  # type: ignore[misc]
        final = e
    w.close()
    extra = {"exit": {"status": "exception", "code": 1, "exception": "cupy.cuda.memory.OutOfMemoryError",
                      "signal": None, "oom_note": oom_note(final)},
             "device_mismatches": len(hook.mismatches)}
    t = read_trace(finalize(w.path, tmp_path / "t.parquet", extra), strict=True)
    ev = t.events
    assert [Op(o).label for o in ev.op] == ["segment_alloc", "malloc", "segment_alloc", "malloc", "free",
                                            "oom"]
    assert ev.device.tolist() == [0, 0, 1, 1, 1, 1]
    assert t.extras is not None
    assert t.extras.column("pool").to_pylist() == [0, 0, 1, 1, 1, 1]
    # device_free: measured at the segment rows and the oom, null on block rows
    assert t.extras.column("device_free").to_pylist() == [1000 * MiB, None, 999 * MiB, None, None, 117 * MiB]
    m = t.meta.extra
    assert m["device_mismatches"] == 2  # the device-1 malloc and the device-1 oom
    (st,) = m["oom_states"]
    assert st["seq"] == 5 and st["device"] == 1 and st["mem_free"] == 117 * MiB
    assert st["limits"]["stack_size"] == 16384 and st["processes"][0]["pid"] == 4242
    assert st["pool"]["limit_bytes"] == 256 * MiB and st["t_ns"] >= 0
    assert m["exit"]["oom_seq"] == 5 and "oom_note" not in m["exit"]
    assert m["ooms"][0]["seq"] == 5 and "state" not in m["ooms"][0]


def test_a_wrong_device_on_a_free_is_corrected_by_its_segment_and_counted(tmp_path: Path) -> None:
    device = [1]
    buf, _, seg_log, w = _setup(tmp_path, device)
    hook = TraceHook(buf, sites=None, current_stream=lambda: STREAM)  # one-device hook: trusts CuPy
    s1 = seg_log(0).malloc(4 * MiB, 1)
    hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=s1, pmem_id=1)  # type: ignore[misc]
    hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=s1, pmem_id=1)  # type: ignore[misc]
    hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=0x1000, pmem_id=1)  # type: ignore[misc]
    w.close()
    t = read_trace(recover(w.path), strict=False)
    assert t.events.device.tolist() == [1, 1, 1, 0]
    assert t.meta.extra["device_mismatches"] == 2
    # a block outside every recorded segment keeps what it had, with no pool
    assert t.extras is not None and t.extras.column("pool").to_pylist() == [1, 1, 1, None]
    assert t.meta.extra["complete"] is False and "exit" not in t.meta.extra


def test_segment_index_finds_the_segment_live_at_the_time_when_ranges_are_reused() -> None:
    # seq 0: A at 0x1000 (4 KiB, pool 0); seq 5: A freed; seq 6: B at 0x1000 (8 KiB, pool 1)
    seq = np.array([0, 5, 6])
    op = np.array([Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.SEGMENT_ALLOC])
    addr = np.array([0x1000, 0x1000, 0x1000], np.uint64)
    idx = SegmentIndex.build(seq, op, addr, np.array([4096, 4096, 8192]), np.array([0, 0, 1]),
                             np.array([0, 0, 0]))
    got = idx.lookup(np.array([1, 4, 7, 7, 3]), np.array([0x1800, 0x1FFF, 0x2800, 0x1000, 0x2000], np.uint64))
    assert [int(idx.pool[i]) if i >= 0 else None for i in got] == [0, 0, 1, 1, None]


def _brute_lookup(idx: SegmentIndex, seq: np.ndarray, addr: np.ndarray) -> list[int]:
    """Check every segment; the last holder in the index's (base, alloc seq) order, -1 for none."""
    out = []
    for s, a in zip(seq.tolist(), addr.tolist(), strict=True):
        hits = [k for k in range(len(idx)) if int(idx.base[k]) <= a < int(idx.end[k])
                and int(idx.alloc_seq[k]) <= s < int(idx.free_seq[k])]
        out.append(hits[-1] if hits else -1)
    return out


# A segment: (base in 256-byte units, size in units, lifetime in seq steps or None for never freed,
# device); small ranges so that bases repeat and ranges nest and overlap in time.
SEGMENTS = st.lists(st.tuples(st.integers(0, 12), st.integers(1, 6), st.none() | st.integers(1, 8),
                              st.integers(0, 1)), max_size=12)
QUERIES = st.lists(st.tuples(st.integers(-1, 40), st.integers(0, 20 * 256)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(SEGMENTS, QUERIES)
def test_segment_lookup_equals_checking_every_segment(segments: list[tuple[int, int, int | None, int]],
                                                      queries: list[tuple[int, int]]) -> None:
    rows = []  # (seq, op, addr, size, pool, device); segment k is allocated at seq 3k
    for k, (base, units, life, dev) in enumerate(segments):
        rows.append((3 * k, Op.SEGMENT_ALLOC, base * 256, units * 256, k, dev))
        if life is not None:
            rows.append((3 * k + life, Op.SEGMENT_FREE, base * 256, units * 256, k, dev))
    rows.sort(key=lambda r: r[0])
    cols = [np.array([r[c] for r in rows], np.int64) for c in range(6)]
    idx = SegmentIndex.build(cols[0], cols[1], cols[2].astype(np.uint64), cols[3], cols[4], cols[5])
    seq = np.array([q[0] for q in queries], np.int64)
    addr = np.array([q[1] for q in queries], np.uint64)
    assert idx.lookup(seq, addr).tolist() == _brute_lookup(idx, seq, addr)


def test_oom_note_follows_the_exception_chain_and_falls_back_to_the_last_oom() -> None:
    inner = OomError("oom")
    inner._tracekit_oom_note = 7  # type: ignore[attr-defined]
    try:
        try:
            raise inner
        except MemoryError as e:
            raise RuntimeError("training step failed") from e
    except RuntimeError as outer:
        assert oom_note(outer) == 7
    assert oom_note(MemoryError("unmarked")) == "last"
    assert oom_note(ValueError("x")) is None and oom_note(None) is None
