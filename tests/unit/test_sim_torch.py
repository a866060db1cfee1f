"""The ``torch`` policy on hand-built traces whose answers follow from CUDACachingAllocator.cpp.

Sizes: requests <= 1 MiB go to the small pool (2 MiB segments), larger ones
to the large pool (20 MiB segments below 10 MiB, else the request rounded up
to 2 MiB). Large blocks split only when the remainder exceeds 1 MiB.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracekit.errors import UsageError
from tracekit.sim.base import SimConfig, Stat, Status
from tracekit.sim.policies.torch_caching import MODEL
from tracekit.sim.torch_rules import (
    options_from_snapshot,
    parse_divisions,
    round_sizes,
    segment_sizes,
    settings,
)
from tracekit.trace import Events, Op, Source, Trace, TraceMeta
from tracekit.trace.validate import pair_events

MIB = 1 << 20
M, F, SA, SF = Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE


def mk(rows, initial=None, rounded=None, expandable=None) -> Trace:
    """A trace from (op, size, addr[, stream]) rows; addr only pairs frees with mallocs."""
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] for r in rows], np.uint64)
    addr = np.array([r[2] for r in rows], np.uint64)
    stream = np.array([r[3] if len(r) > 3 else 0 for r in rows], np.uint64)
    rnd = None if rounded is None else np.array(rounded, np.uint64)
    ev = Events.build(op, size, addr=addr, stream=stream, rounded=rnd)
    pairing = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    cols = {"initial": initial, "expandable": expandable}
    given = {k: pa.array(v, pa.bool_()) for k, v in cols.items() if v is not None}
    extras = pa.table(given) if given else None
    return Trace(None, TraceMeta.new(Source.SYNTHETIC), ev, pairing.mate, extras, ())


def run(rows, capacity=None, options=None, cont=False, **kw):
    return MODEL.run(mk(rows, **kw), SimConfig(capacity, None, cont, options or {}))


def seg_rows(r):
    return [(Op(int(o)).label[8:], int(s) // MIB if s >= MIB else int(s))
            for o, s in zip(r.rows_op, r.rows_size, strict=True)]


def test_round_size_default_and_power2_divisions():
    sizes = np.array([1, 512, 513, 5 * MIB + 1, 8 * MIB, 1500, 3 * MIB + 1])
    assert list(round_sizes(sizes)) == [512, 512, 1024, 5 * MIB + 512, 8 * MIB, 1536, 3 * MIB + 512]
    d4 = (4,) * 16
    # 5 MiB + 1 with 4 divisions: steps of 1 MiB between 4 and 8 MiB -> 6 MiB; powers of two stay;
    # 1500 B is not above 512 x 4, so it keeps the 512 rounding.
    assert list(round_sizes(sizes, d4)) == [512, 512, 1024, 6 * MIB, 8 * MIB, 1536, 3 * MIB + 512 * 1024]


def test_parse_divisions_like_pytorch():
    assert parse_divisions("4") == (4,) * 16
    table = parse_divisions("[256:1,512:2,1024:4,>:8]")
    assert table == (1,) * 9 + (2, 4) + (8,) * 5
    with pytest.raises(UsageError):
        parse_divisions("3")


def test_segment_sizes():
    r = np.array([512, MIB, MIB + 512, 10 * MIB - 512, 10 * MIB, 11 * MIB + 512])
    assert list(segment_sizes(r) // MIB) == [2, 2, 20, 20, 10, 12]


def test_settings_checks_keys_and_values():
    s = settings({"max_split_size_mb": "256", "expandable_segments": "True",
                  "roundup_power2_divisions": "[>:4]", "release_lock_on_cudamalloc": "True"})
    assert s.max_split_size == 256 * MIB and s.expandable_segments
    for bad in ({"max_split_size_mb": "20"}, {"expandable_segments": "yes"}, {"nope": "1"},
                {"garbage_collection_threshold": "1.5"}, {"release_points": "x"}):
        with pytest.raises(UsageError):
            settings(bad)


def test_options_from_snapshot_settings():
    snap = {"expandable_segments": True, "max_split_size": 512 * MIB,
            "roundup_power2_divisions": {"1": 0, "2": 4}, "garbage_collection_threshold": 0.6}
    opts = options_from_snapshot(snap)
    assert opts == {"expandable_segments": "True", "max_split_size_mb": "512",
                    "roundup_power2_divisions": "[1:0,2:4]", "garbage_collection_threshold": "0.6"}
    assert settings(opts).roundup_power2_divisions[1] == 4
    assert options_from_snapshot({"max_split_size": -1, "expandable_segments": False}) == {}


def test_pools_never_share():
    r = run([(M, MIB, 1), (F, MIB, 1), (M, MIB + 1, 2), (F, 0, 2), (M, 1000, 3)])
    assert seg_rows(r) == [("alloc", 2), ("alloc", 20)]
    assert int(r.addr[4]) == int(r.addr[0])  # the small request reuses the small segment


def test_large_split_only_above_1mib_remainder():
    # 19.5 MiB in a 20 MiB segment: 0.5 MiB stays inside the block as slack.
    r = run([(M, 19 * MIB + MIB // 2, 1), (M, 3 * MIB, 2), (M, 3 * MIB, 3)])
    assert r.stats[Stat.PEAK_LIVE] == 20 * MIB + 6 * MIB
    # The 3 MiB requests share one 20 MiB segment (remainders 17 and 14 MiB split off).
    assert seg_rows(r) == [("alloc", 20), ("alloc", 20)]
    assert int(r.addr[2]) == int(r.addr[1]) + 3 * MIB


def test_small_pool_splits_at_512():
    r = run([(M, 1000, 1), (M, 600, 2)])
    assert int(r.addr[1]) == int(r.addr[0]) + 1024
    assert seg_rows(r) == [("alloc", 2)]


def test_best_fit_and_merge():
    rows = [(M, 30 * MIB, 1), (M, 12 * MIB, 2), (M, 20 * MIB, 3), (F, 0, 1), (F, 0, 3),
            (M, 12 * MIB, 4), (F, 0, 2), (M, 22 * MIB, 5)]
    r = run(rows)
    # Free: 30 MiB and 20 MiB segments; 12 MiB goes to the 20 MiB one (best fit), split (8 > 1 MiB).
    assert int(r.addr[5]) == int(r.addr[2])
    # After freeing the 12 MiB segment, 22 MiB fits only the 30 MiB segment.
    assert int(r.addr[7]) == int(r.addr[0])
    assert r.stats[Stat.SEGMENT_ALLOCS] == 3


def test_max_split_size_rules():
    opts = {"max_split_size_mb": "40"}
    # A request below M never takes a cached block >= M.
    r = run([(M, 50 * MIB, 1), (F, 0, 1), (M, 30 * MIB, 2)], options=opts)
    assert seg_rows(r) == [("alloc", 50), ("alloc", 30)]
    # A request >= M takes a block below request + 20 MiB, but not a larger one.
    r = run([(M, 50 * MIB, 1), (F, 0, 1), (M, 44 * MIB, 2), (M, 100 * MIB, 3), (F, 0, 3), (M, 44 * MIB, 4)],
            options=opts)
    assert int(r.addr[2]) == int(r.addr[0])
    assert seg_rows(r) == [("alloc", 50), ("alloc", 100), ("alloc", 44)]
    # A block >= M is never split: the 44 MiB request holds the whole 50 MiB block.
    assert r.stats[Stat.PEAK_LIVE] == 50 * MIB + 100 * MIB


def test_limit_releases_cached_segments_then_retries():
    r = run([(M, 30 * MIB, 1), (F, 0, 1), (M, 32 * MIB, 2)], capacity=40 * MIB)
    assert r.status[2] == Status.DONE
    assert seg_rows(r) == [("alloc", 30), ("free", 30), ("alloc", 32)]
    assert list(r.rows_before) == [0, 2, 2]


def test_limit_oom_and_its_numbers():
    r = run([(M, 30 * MIB, 1), (M, 12 * MIB, 2), (M, MIB, 3)], capacity=40 * MIB)
    assert list(r.status) == [Status.DONE, Status.OOM, Status.IGNORED]
    assert r.stats[Stat.FIRST_OOM] == 1 and r.stats[Stat.OOM_ROUNDED] == 12 * MIB
    assert r.stats[Stat.OOM_RESERVED] == 30 * MIB and r.stats[Stat.OOM_LIVE] == 30 * MIB
    assert r.stats[Stat.OOM_FREE] == 0 and r.stats[Stat.OOM_LARGEST] == 0
    cont = run([(M, 30 * MIB, 1), (M, 12 * MIB, 2), (M, MIB, 3), (F, 0, 2)], capacity=40 * MIB, cont=True)
    assert list(cont.status) == [Status.DONE, Status.OOM, Status.DONE, Status.SKIPPED]


def test_release_available_frees_largest_first_with_max_split():
    rows = [(M, 50 * MIB, 1), (M, 44 * MIB, 2), (F, 0, 1), (F, 0, 2), (M, 60 * MIB, 3)]
    r = run(rows, capacity=100 * MIB, options={"max_split_size_mb": "40"})
    assert r.status[4] == Status.DONE
    assert seg_rows(r) == [("alloc", 50), ("alloc", 44), ("free", 50), ("free", 44), ("alloc", 60)]
    # Without max_split_size, release_cached_blocks frees in (size, address) order.
    r = run(rows, capacity=100 * MIB)
    assert seg_rows(r) == [("alloc", 50), ("alloc", 44), ("free", 44), ("free", 50), ("alloc", 60)]


def test_split_segment_is_not_released():
    rows = [(M, 3 * MIB, 1), (M, 3 * MIB, 2), (F, 0, 1), (M, 30 * MIB, 3)]
    r = run(rows, capacity=40 * MIB)
    assert r.status[3] == Status.OOM and r.stats[Stat.SEGMENT_FREES] == 0
    assert r.stats[Stat.OOM_FREE] == 17 * MIB and r.stats[Stat.OOM_LARGEST] == 14 * MIB


def test_streams_do_not_share():
    r = run([(M, 3 * MIB, 1, 7), (F, 0, 1, 7), (M, 3 * MIB, 2, 9)])
    assert seg_rows(r) == [("alloc", 20), ("alloc", 20)]
    assert list(r.rows_stream) == [7, 9]


def test_trace_release_point_empties_the_cache():
    rows = [(M, 30 * MIB, 1), (M, 3 * MIB, 2), (F, 0, 1), (SF, 30 * MIB, 77), (M, 30 * MIB, 3)]
    r = run(rows)
    assert seg_rows(r) == [("alloc", 30), ("alloc", 20), ("free", 30), ("alloc", 30)]
    assert list(r.rows_before) == [0, 1, 3, 4]
    kept = run(rows, options={"release_points": "none"})
    assert seg_rows(kept) == [("alloc", 30), ("alloc", 20)]


def test_recorded_segment_addresses_are_reused():
    base = 0x7F0000000000
    rows = [(SA, 20 * MIB, base), (M, 3 * MIB, base), (SA, 30 * MIB, base - 64 * MIB),
            (M, 30 * MIB, base - 64 * MIB)]
    r = run(rows)
    assert [int(a) for a in r.addr[[1, 3]]] == [base, base - 64 * MIB]
    inv = run(rows, options={"addresses": "invent"})
    assert int(inv.addr[1]) != base


def test_expandable_segments_map_pages():
    opts = {"expandable_segments": "True"}
    rows = [(M, 1000, 1), (M, 3 * MIB, 2), (M, 30 * MIB, 3), (F, 0, 2), (M, 2 * MIB, 4)]
    r = run(rows, options=opts)
    # Small pool maps a 2 MiB page; the large pool maps 20 MiB pages on demand: 3 MiB maps one,
    # 30 MiB uses the 17 MiB free tail plus one more page. One row per page.
    assert seg_rows(r) == [("alloc", 2), ("alloc", 20), ("alloc", 20)]
    base = int(r.addr[1])
    assert int(r.addr[2]) == base + 3 * MIB
    assert int(r.addr[4]) == base  # best fit: the freed 3 MiB block at the lowest address
    assert r.stats[Stat.PEAK_RESERVED] == 42 * MIB


def test_expandable_release_unmaps_free_pages():
    opts = {"expandable_segments": "True"}
    rows = [(M, 30 * MIB, 1), (M, 3 * MIB, 2), (F, 0, 1), (SF, 0, 99), (M, 10 * MIB, 3)]
    r = run(rows, options=opts)
    # [0, 30) is free, [30, 33) is live: only the first 20 MiB page is wholly free; the
    # 10 MiB request then fits the still-mapped [20, 30) exactly, mapping nothing.
    assert seg_rows(r) == [("alloc", 20), ("alloc", 20), ("free", 20)]
    assert list(r.rows_addr) == [r.addr[0], r.addr[0] + 20 * MIB, r.addr[0]]
    assert int(r.addr[4]) == int(r.addr[0]) + 20 * MIB


def test_expandable_limit_checks_the_segment_size_not_the_mapping():
    # PyTorch compares reserved + segment size (26 MiB) with the limit, then maps 40 MiB.
    r = run([(M, 25 * MIB, 1)], capacity=30 * MIB, options={"expandable_segments": "True"})
    assert r.status[0] == Status.DONE and r.stats[Stat.PEAK_RESERVED] == 40 * MIB


def test_initial_state_holds_segments_and_blocks():
    base = 0x7F0000000000
    rows = [(SA, 20 * MIB, base), (M, 4 * MIB, base + 2 * MIB), (M, 8 * MIB, 1), (M, 2 * MIB, 2),
            (F, 0, base + 2 * MIB), (M, 6 * MIB, 3)]
    r = run(rows, initial=[True, True, False, False, False, False])
    assert int(r.addr[1]) == base + 2 * MIB
    # Free at the start: [0, 2) and [6, 20) MiB; 8 MiB goes to offset 6, 2 MiB fits [0, 2) exactly.
    assert int(r.addr[2]) == base + 6 * MIB and int(r.addr[3]) == base
    # The freed [2, 6) borders live blocks only; 6 MiB takes the free [14, 20).
    assert int(r.addr[5]) == base + 14 * MIB
    assert seg_rows(r) == [("alloc", 20)] and list(r.rows_before) == [0]


def test_initial_state_of_expandable_segments():
    base = 0x300000000
    rows = [(SA, 40 * MIB, base), (M, 3 * MIB, base), (M, 30 * MIB, 1), (M, 10 * MIB, 2)]
    r = run(rows, options={"expandable_segments": "True"}, initial=[True, True, False, False],
            expandable=[True, False, False, False])
    # The recorded 40 MiB mapping holds the live 3 MiB block; 30 MiB fits the mapped free rest.
    assert int(r.addr[2]) == base + 3 * MIB
    # 10 MiB: the free [33, 40) MiB borders unmapped space of the same segment: one more 20 MiB page.
    assert int(r.addr[3]) == base + 33 * MIB
    assert seg_rows(r) == [("alloc", 20), ("alloc", 20), ("alloc", 20)]
    assert [int(a) for a in r.rows_addr] == [base, base + 20 * MIB, base + 40 * MIB]


def test_garbage_collection_threshold_releases_old_cached_blocks():
    # Limit 200 MiB, threshold 0.4 -> collect above 80 MiB reserved. Large-pool lookups count
    # ages: A is cached after lookup 2, B after lookup 3; at lookup 4 (H misses with 94 MiB
    # reserved) A is 2 old, B 1; the average is 1.5, so only A goes, which covers 94 - 80.
    rows = [(M, 30 * MIB, 1), (M, 24 * MIB, 2), (F, 0, 1), (M, 40 * MIB, 3), (F, 0, 2), (M, 50 * MIB, 4)]
    opts = {"garbage_collection_threshold": "0.4"}
    r = run(rows, capacity=200 * MIB, options=opts)
    assert seg_rows(r) == [("alloc", 30), ("alloc", 24), ("alloc", 40), ("free", 30), ("alloc", 50)]
    assert list(r.rows_before) == [0, 1, 3, 5, 5]
    # Without a limit (no memory fraction) PyTorch never collects.
    assert seg_rows(run(rows, options=opts)) == [("alloc", 30), ("alloc", 24), ("alloc", 40), ("alloc", 50)]


def test_impossible_request_is_an_oom_not_an_overflow():
    r = run([(M, 2**63 + 5, 1), (M, 512, 2)], capacity=1 << 40, cont=True)
    assert list(r.status) == [Status.OOM, Status.DONE]


# release_available_cached_blocks (max_split_size M = 64 MiB): on a refused cudaMalloc, with
# key = max(request, M), free the smallest cached block >= key on the request's stream and pool;
# else walk that stream's cached blocks from the largest down while they are >= M, freeing them
# until the freed bytes reach key; only if that fails, release_cached_blocks frees every one.
M64 = {"max_split_size_mb": "64"}
A = [0x7F0000000000 + k * (1 << 32) for k in range(8)]


def _cached(sizes_mib, live_mib, stream_of=None):
    """Rows: one segment per block (recorded), the live one kept, the others freed (cached)."""
    rows = []
    for k, s in enumerate([live_mib, *sizes_mib]):
        st = (stream_of or {}).get(k, 1)
        rows += [(SA, s * MIB, A[k], st), (M, s * MIB, A[k], st)]
    rows += [(F, 0, A[k], (stream_of or {}).get(k, 1)) for k in range(1, len(sizes_mib) + 1)]
    return rows


def test_release_available_frees_the_largest_blocks_until_the_key():
    # The H200 case: two 250 MiB blocks are freed for a 376 MiB request, the 100 MiB one stays.
    rows = _cached([250, 250, 100], 300)
    recorded = [(SF, 250 * MIB, A[2], 1), (SF, 250 * MIB, A[1], 1), (SA, 376 * MIB, A[5], 1)]
    for tail in (recorded, []):  # with PyTorch's recorded rows, and from the cap alone
        r = run([*rows, *tail, (M, 376 * MIB, A[5], 1)], capacity=1000 * MIB, options=M64)
        assert r.status[-1] == Status.DONE
        assert seg_rows(r)[4:] == [("free", 250), ("free", 250), ("alloc", 376)]


def test_release_available_frees_one_block_that_covers_the_key():
    r = run([*_cached([250, 400, 500], 300), (M, 376 * MIB, A[5], 1)], capacity=1500 * MIB, options=M64)
    assert seg_rows(r)[4:] == [("free", 400), ("alloc", 376)]


def test_release_available_keeps_to_the_request_stream():
    # The 500 MiB block is cached on stream 2: not the request's stream, so it stays.
    rows = _cached([250, 250, 500], 300, stream_of={3: 2})
    r = run([*rows, (M, 376 * MIB, A[5], 1)], capacity=1400 * MIB, options=M64)
    assert seg_rows(r)[4:] == [("free", 250), ("free", 250), ("alloc", 376)]


def test_release_available_stops_below_max_split_then_everything_goes():
    # The walk frees 250 MiB (not enough) and stops at 40 MiB, below M; the freed block stays
    # freed, and release_cached_blocks then frees the rest.
    r = run([*_cached([250, 40], 300), (M, 376 * MIB, A[5], 1)], capacity=900 * MIB, options=M64)
    assert seg_rows(r)[3:] == [("free", 250), ("free", 40), ("alloc", 376)]


def test_recorded_release_beyond_release_available_means_release_cached():
    # The recording freed 600 MiB for the request (the device refused once more): all three go.
    rows = _cached([250, 250, 100], 300)
    recorded = [(SF, 100 * MIB, A[3], 1), (SF, 250 * MIB, A[1], 1), (SF, 250 * MIB, A[2], 1),
                (SA, 376 * MIB, A[5], 1)]
    r = run([*rows, *recorded, (M, 376 * MIB, A[5], 1)], options=M64)
    assert sorted(seg_rows(r)[4:7]) == [("free", 100), ("free", 250), ("free", 250)]
    assert seg_rows(r)[7:] == [("alloc", 376)]
