"""The ``cupy`` policy against CuPy's own pool tests (tests/cupy_tests/cuda_tests/test_memory.py).

Each test replays a hand-built request sequence whose answer follows from the
pool's rules: best fit with the low part kept, merge on free, exact-size device
allocations, and ``_try_malloc``'s limit sequence (free_all_blocks, then
OutOfMemoryError). u = 512 bytes, CuPy's allocation unit.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from tracekit.sim.base import SimConfig, Stat, Status
from tracekit.sim.policies.cupy_pool import MODEL
from tracekit.trace import Events, Op, Source, Trace, TraceMeta
from tracekit.trace.validate import pair_events

U = 512
M, F, SA, SF, OO = Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.OOM


def mk(rows, initial=None) -> Trace:
    """A trace from (op, size, addr[, stream]) rows; addr only pairs frees with mallocs."""
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] for r in rows], np.uint64)
    addr = np.array([r[2] for r in rows], np.uint64)
    stream = np.array([r[3] if len(r) > 3 else 0 for r in rows], np.uint64)
    ev = Events.build(op, size, addr=addr, stream=stream)
    pairing = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    extras = None if initial is None else pa.table({"initial": pa.array(initial, pa.bool_())})
    return Trace(None, TraceMeta.new(Source.SYNTHETIC), ev, pairing.mate, extras, ())


def run(rows, limit=None, device_total=None, cont=False, initial=None):
    return MODEL.run(mk(rows, initial), SimConfig(limit, device_total, cont))


def seg_rows(r):
    return [(Op(int(o)).label, int(s)) for o, s in zip(r.rows_op, r.rows_size, strict=True)]


def test_alloc_split():
    r = run([(M, 4 * U, 1), (F, 4 * U, 1), (M, 2 * U, 2), (M, 2 * U, 3)])
    base = int(r.addr[0])
    assert int(r.addr[2]) == base and int(r.addr[3]) == base + 2 * U
    assert seg_rows(r) == [("segment_alloc", 4 * U)]


def test_free_merge_both_orders():
    for first, second in ((2, 3), (3, 2)):
        r = run([(M, 4 * U, 1), (F, 4 * U, 1), (M, 2 * U, 2), (M, 2 * U, 3),
                 (F, 2 * U, first), (F, 2 * U, second), (M, 4 * U, 4)])
        assert int(r.addr[6]) == int(r.addr[0])  # merged back into one 4u chunk
        assert r.stats[Stat.SEGMENT_ALLOCS] == 1


def test_free_different_size():
    r = run([(M, 4 * U, 1), (F, 4 * U, 1), (M, 8 * U, 2)])
    assert seg_rows(r) == [("segment_alloc", 4 * U), ("segment_alloc", 8 * U)]
    assert r.stats[Stat.PEAK_RESERVED] == 12 * U


def test_alloc_limit():
    r = run([(M, 5 * U, 1), (M, 1 * U, 2), (M, 1 * U, 3)], limit=6 * U)
    assert list(r.status) == [Status.DONE, Status.DONE, Status.OOM]
    assert r.stats[Stat.FIRST_OOM] == 2
    assert r.stats[Stat.OOM_RESERVED] == 6 * U and r.stats[Stat.OOM_ROUNDED] == U
    assert r.stats[Stat.OOM_FREE] == 0 and r.stats[Stat.OOM_LARGEST] == 0


def test_request_over_limit_fails_without_releasing():
    r = run([(M, U, 1), (F, U, 1), (M, 7 * U, 2)], limit=6 * U)
    assert r.status[2] == Status.OOM
    assert seg_rows(r) == [("segment_alloc", U)]  # s > limit raises before free_all_blocks


def test_alloc_limit_fragmented():
    # test_alloc_limit_fragmented: the freed 5u allocation is released to fit 6u.
    r = run([(M, 5 * U, 1), (F, 5 * U, 1), (M, 6 * U, 2)], limit=6 * U)
    assert r.status[2] == Status.DONE
    assert seg_rows(r) == [("segment_alloc", 5 * U), ("segment_free", 5 * U), ("segment_alloc", 6 * U)]
    assert list(r.rows_before) == [0, 2, 2]


def test_free_all_blocks_split():
    # One piece of the 4u allocation stays live: nothing can be released, so the limit holds.
    rows = [(M, 4 * U, 1), (F, 4 * U, 1), (M, 2 * U, 2), (M, 2 * U, 3), (F, 2 * U, 2), (M, 4 * U, 4)]
    r = run(rows, limit=6 * U)
    assert r.status[5] == Status.OOM
    assert r.stats[Stat.SEGMENT_FREES] == 0
    assert r.stats[Stat.OOM_FREE] == 2 * U and r.stats[Stat.OOM_LARGEST] == 2 * U


def test_best_fit_prefers_smallest_then_lowest_address():
    rows = [(M, 3 * U, 1), (M, U, 2), (M, 2 * U, 3), (M, U, 4), (M, 2 * U, 5), (M, U, 6),
            (F, 3 * U, 1), (F, 2 * U, 3), (F, 2 * U, 5), (M, 2 * U, 7)]
    r = run(rows)
    # Free: 3u (alloc 0), 2u (alloc 2), 2u (alloc 4): the 2u with the lower address wins.
    assert int(r.addr[9]) == int(r.addr[2])
    assert r.stats[Stat.SEGMENT_ALLOCS] == 6


def test_streams_have_separate_arenas():
    r = run([(M, 4 * U, 1, 7), (F, 4 * U, 1, 7), (M, 4 * U, 2, 9)])
    assert r.stats[Stat.SEGMENT_ALLOCS] == 2
    assert list(r.rows_stream) == [7, 9]


def test_rounding_and_zero_size():
    r = run([(M, 1, 1), (M, 0, 0), (M, 513, 2)])
    assert list(r.rounded) == [U, 0, 2 * U]
    assert int(r.addr[1]) == 0 and r.status[1] == Status.DONE
    assert r.stats[Stat.SEGMENT_ALLOCS] == 2


def test_continue_on_oom_skips_the_failed_free():
    rows = [(M, 4 * U, 1), (M, 4 * U, 2), (F, 4 * U, 2), (M, U, 3)]
    r = run(rows, limit=6 * U, cont=True)
    assert list(r.status) == [Status.DONE, Status.OOM, Status.SKIPPED, Status.DONE]
    stop = run(rows, limit=6 * U)
    assert list(stop.status) == [Status.DONE, Status.OOM, Status.IGNORED, Status.IGNORED]


def test_oom_row_is_replayed_as_malloc():
    r = run([(M, 4 * U, 1), (OO, 8 * U, 0)], limit=10 * U)
    assert r.status[1] == Status.OOM
    ok = run([(M, 4 * U, 1), (OO, 8 * U, 0)], limit=12 * U)
    assert ok.status[1] == Status.DONE


def test_device_total_counts_2mib_pages_and_releases_first():
    mib = 1 << 20
    # 1 MiB + 512 costs a whole 2 MiB page: two fit in 4 MiB, a third does not ...
    r = run([(M, mib + U, 1), (M, mib + U, 2), (M, mib + U, 3)], device_total=4 * mib)
    assert list(r.status) == [Status.DONE, Status.DONE, Status.OOM]
    # ... unless a cached whole allocation can be given back first.
    r = run([(M, mib + U, 1), (M, mib + U, 2), (F, mib + U, 2), (M, mib + 2 * U, 3)],
            device_total=4 * mib)
    assert r.status[3] == Status.DONE
    assert [x[0] for x in seg_rows(r)] == ["segment_alloc", "segment_alloc", "segment_free", "segment_alloc"]


def test_input_segment_rows_are_ignored():
    r = run([(SA, 8 * U, 100), (M, 4 * U, 1), (SF, 8 * U, 100)])
    assert list(r.status) == [Status.IGNORED, Status.DONE, Status.IGNORED]
    assert r.stats[Stat.SEGMENT_ALLOCS] == 1


def test_initial_state_is_loaded():
    base = 1 << 30
    rows = [(SA, 8 * U, base), (M, 2 * U, base + 2 * U), (M, 6 * U, 1), (F, 2 * U, base + 2 * U),
            (M, 4 * U, 2)]
    r = run(rows, initial=[True, True, False, False, False])
    assert int(r.addr[1]) == base + 2 * U
    # Free after the live block: [base+4u, base+8u) fits 4u but not 6u.
    assert int(r.addr[2]) != base and r.stats[Stat.SEGMENT_ALLOCS] == 2
    # After the free, the whole 8u is one chunk again; 4u goes to its start.
    assert int(r.addr[4]) == base


def test_recorded_addresses_and_tie_choices_are_followed():
    a, b = 1 << 30, 1 << 31
    rows = [(SA, 4 * U, a), (M, 4 * U, a), (SA, 4 * U, b), (M, 4 * U, b), (F, 4 * U, a), (F, 4 * U, b),
            (M, 4 * U, b)]
    r = MODEL.run(mk(rows), SimConfig())
    assert [int(x) for x in r.addr[[1, 3]]] == [a, b]  # device addresses as recorded
    assert int(r.addr[6]) == b  # the recording shows CuPy taking b among two equal chunks
    low = MODEL.run(mk(rows), SimConfig(options={"ties": "address"}))
    assert int(low.addr[6]) == a
    invented = MODEL.run(mk(rows), SimConfig(options={"addresses": "invent"}))
    assert int(invented.addr[1]) not in (a, b)


def test_bad_options_are_usage_errors():
    import pytest

    from tracekit.errors import UsageError

    for opts in ({"expandable_segments": "True"}, {"ties": "random"}, {"addresses": "x"},
                 {"release_points": "always"}):
        with pytest.raises(UsageError):
            MODEL.run(mk([(M, U, 1)]), SimConfig(options=opts))


def test_impossible_request_is_an_oom_not_an_overflow():
    r = run([(M, 2**63 + 5, 1), (M, U, 2)], limit=1 << 40, cont=True)
    assert list(r.status) == [Status.OOM, Status.DONE]


def test_recorded_release_of_one_stream_keeps_the_other_arenas():
    # free_all_blocks(stream=7) released only stream 7's cached 4 KiB allocation: stream 9's stays
    # cached and serves the next 4 KiB request there; a release of every arena would not.
    rows = [(M, 8 * U, 1, 7), (M, 8 * U, 2, 9), (F, 0, 1, 7), (F, 0, 2, 9), (SF, 8 * U, 1, 7),
            (M, 8 * U, 3, 9)]
    r = run(rows)
    assert seg_rows(r) == [("segment_alloc", 8 * U), ("segment_alloc", 8 * U), ("segment_free", 8 * U)]
    assert list(r.rows_stream) == [7, 9, 7] and int(r.addr[5]) == int(r.addr[1])
