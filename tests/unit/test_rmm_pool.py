"""``rmm-pool``: RMM's pool_memory_resource rules on hand-built logs with worked answers, and its
invariants (no overlap, 256-byte alignment, live and pool bytes conserved) on generated ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.importers.rmm_log import import_log
from tracekit.sim import policies
from tracekit.sim.base import Allocator, SimConfig
from tracekit.sim.codes import Field as F
from tracekit.sim.codes import Piece as P
from tracekit.sim.codes import Slot, Stat, Status
from tracekit.sim.engine import replay
from tracekit.sim.policies._rmm_kernel import Found
from tracekit.sim.policies.rmm_pool import MODEL, stream_lists
from tracekit.trace import Op, Source
from tracekit.trace.reader import Trace, read_trace

# One request or free: ("a", block id, bytes, stream) or ("f", block id, stream).
Step = tuple


def _trace(tmp: Path, steps: list[Step], name: str = "log.csv") -> Trace:
    """The trace of an RMM log holding ``steps`` (block b at the address 0x7f00_0000_0000 + b * 2^30)."""
    lines = ["Thread,Time,Action,Pointer,Size,Stream"]
    size: dict[int, int] = {}
    for k, s in enumerate(steps):
        t = f"10:00:00.{k:06d}"
        if s[0] == "a":
            size[s[1]] = s[2]
            lines.append(f"7,{t},allocate,{0x7F0000000000 + s[1] * (1 << 30):#x},{s[2]},{s[3]:x}")
        else:
            lines.append(f"7,{t},free,{0x7F0000000000 + s[1] * (1 << 30):#x},{size[s[1]]},{s[2]:x}")
    log = tmp / name
    log.write_text("\n".join(lines) + "\n")
    return read_trace(import_log(log, force=True).path)


def _run(trace: Trace, maximum: int | None = None, initial: int = 0, device_total: int | None = None):
    cfg = SimConfig(capacity=maximum, device_total=device_total, options={"initial_pool_size": str(initial)})
    return MODEL.run_with_state(trace, cfg)


def test_registered_for_rmm_logs() -> None:
    assert policies.for_source(Source.RMM) == "rmm-pool"
    assert policies.modelling(Allocator.RMM_POOL) == "rmm-pool" and policies.is_pool("rmm-pool")
    assert "rmm-pool" not in policies.whatif_defaults()  # searched when named, as the device models are


def test_growth_without_a_maximum_doubles(tmp_path: Path) -> None:
    # size_to_grow without a maximum: max(request, pool size). 1024, then max(3072, 1024), then
    # max(5120, 4096): three upstream blocks, 9216 B. The freed 3072 B block then serves 2000 B
    # (best fit: the 1024 B block is too small), so nothing grows.
    tr = _trace(tmp_path, [("a", 0, 1000, 0), ("a", 1, 3000, 0), ("a", 2, 5000, 0), ("f", 0, 0), ("f", 1, 0),
                           ("a", 3, 2000, 0)])
    run, _, _, found = _run(tr)
    assert run.rows_size.tolist() == [1024, 3072, 5120]
    assert run.stats[Stat.PEAK_RESERVED] == 9216 and run.stats[Stat.FIRST_OOM] == -1
    assert run.rounded.tolist()[:3] == [1024, 3072, 5120]
    assert run.addr[5] == run.addr[1]  # the 3072 B block, its low part
    assert found[Found.GREW] == 3 and found[Found.OWN] == 1


REQS: list[Step] = [("a", 0, 1000, 0), ("a", 1, 2048, 0), ("a", 2, 4096, 0), ("a", 3, 512, 0),
                    ("a", 4, 1024, 0)]


@pytest.mark.parametrize("maximum,fails_at,pool", [
    # M = 8192: 1024 B grows the pool by max(1024, 8192 / 2) = 4096; 2048 B fits its rest; 4096 B grows
    # it by max(4096, 4096 / 2) to 8192; 512 B fits the first block's rest, and 1024 B finds 512 B
    # free and no room to grow: it fails (event 4), the pool at 8192 B.
    (8192, 4, 8192),
    # M = 8448: the first block is max(1024, 8448 / 2) = 4224 B (rest 3200, then 1152); 4096 B finds
    # remaining = align_up(4224) = 4352 and grows by max(4096, 2176) = 4096 to 8320 B; 512 B leaves
    # 640 B; for 1024 B remaining is align_up(128) = 256 B: it fails. The pool passed M - 128.
    (8448, 4, 8320),
    # M = 9216: the first block is 4608 B (rest 3584, then 1536 after 2048 B); 4096 B grows by
    # max(4096, 4608 / 2) = 4096 to 8704; 512 B takes the 1536 B rest's low part, 1024 B the other 1024.
    (9216, -1, 8704),
    (None, -1, 1024 + 2048 + 4096 + 7168),  # no maximum: see below
])
def test_which_event_fails_under_a_maximum(tmp_path: Path, maximum: int | None, fails_at: int,
                                            pool: int) -> None:
    tr = _trace(tmp_path, REQS)
    run, *_ = _run(tr, maximum)
    assert run.stats[Stat.FIRST_OOM] == fails_at
    if maximum is None:
        # 1024; 2048 = max(2048, 1024); 4096 = max(4096, 3072); 512 = max(512, 7168) = 7168 (its rest
        # then serves 1024 B): 14336 B in four blocks.
        assert run.rows_size.tolist() == [1024, 2048, 4096, 7168]
    assert run.stats[Stat.PEAK_RESERVED] == pool
    rep = replay(tr, "rmm-pool", SimConfig(capacity=maximum, options={"initial_pool_size": "0"}))
    assert (rep.summary.oom is None) == (fails_at < 0)
    if fails_at >= 0:
        assert rep.summary.oom is not None and rep.summary.oom.rounded == 1024


def test_a_full_pool_gives_its_wholly_free_blocks_back_before_it_grows(tmp_path: Path) -> None:
    # M = 1536: 1 B (256 aligned) grows the pool by max(256, 1536 / 2) = 768 B, freed; 769 B (1024
    # aligned) does not fit the free 768 B block, and remaining = 1536 - 768 = 768 B < 1024: RMM's
    # reclaim_free_blocks gives the wholly free 768 B block back (room 1536), then the pool grows by
    # max(1024, 1536 / 2) = 1024 B. Without the reclaim the request would fail.
    tr = _trace(tmp_path, [("a", 0, 1, 0), ("f", 0, 0), ("a", 1, 769, 0)])
    run, *_ = _run(tr, 1536)
    assert run.stats[Stat.FIRST_OOM] == -1
    assert run.rows_op.tolist() == [Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.SEGMENT_ALLOC]
    assert run.rows_size.tolist() == [768, 768, 1024] and run.rows_before.tolist() == [0, 2, 2]
    assert run.stats[Stat.PEAK_RESERVED] == 1024


def test_a_stream_takes_from_another_then_merges_their_lists(tmp_path: Path) -> None:
    # The initial 4096 B block is on the legacy stream's list. Stream 0x10 finds nothing on its own
    # list and takes 1024 B from the legacy list as it is (the rest, 3072 B, stays there); its free
    # puts the block on 0x10's list. A 4096 B request on the default stream fits neither list alone:
    # merging 0x10's list into the legacy one coalesces 1024 + 3072 B, and the pool never grows.
    tr = _trace(tmp_path, [("a", 0, 1024, 0x10), ("f", 0, 0x10), ("a", 1, 4096, 0)])
    run, _, _, found = _run(tr, initial=4096)
    assert found[Found.OTHER] == 1 and found[Found.MERGED] == 1 and found[Found.GREW] == 0
    assert run.stats[Stat.PEAK_RESERVED] == 4096 and run.addr[2] == run.addr[0]
    assert run.rows_before.tolist() == [0] and run.rows_size.tolist() == [4096]  # the initial block only


def test_frees_coalesce_only_on_one_list_and_within_one_upstream_block(tmp_path: Path) -> None:
    # Two adjacent 1024 B blocks freed on two streams stay two blocks; a 2048 B request on stream 0x20
    # then finds 1024 B on each list, merges them (coalescing) and needs no growth.
    steps: list[Step] = [("a", 0, 1024, 0), ("a", 1, 1024, 0), ("a", 9, 2048, 0), ("f", 0, 0x20), ("f", 1, 0)]
    tr = _trace(tmp_path, steps)
    _, C, S, _ = _run(tr, initial=4096)
    live = C[: S[Slot.HW]]
    free = live[live[:, F.STATE] == P.FREE]
    assert sorted(free[:, F.SIZE].tolist()) == [1024, 1024]  # not merged: two lists
    tr2 = _trace(tmp_path, [*steps, ("a", 2, 2048, 0x20)], "b.csv")
    run2, _, _, found2 = _run(tr2, initial=4096)
    assert found2[Found.MERGED] == 1 and run2.stats[Stat.PEAK_RESERVED] == 4096
    # Two upstream blocks never coalesce (RMM: a block is never merged with an upstream block's
    # head): without an initial pool the blocks are 1024 and max(1024, 1024) B, and a 2048 B request
    # after both are freed grows the pool.
    steps3: list[Step] = [("a", 0, 1024, 0), ("a", 1, 1024, 0), ("f", 0, 0), ("f", 1, 0), ("a", 2, 2048, 0)]
    tr3 = _trace(tmp_path, steps3, "c.csv")
    run3, *_ = _run(tr3)
    assert run3.rows_size.tolist() == [1024, 1024, 2048]


def test_per_thread_default_stream_has_a_list_per_thread() -> None:
    stream = np.array([0, 1, 2, 2, 0x55, 2], np.uint64)
    thread = np.array([7, 7, 7, 8, 7, 7], np.uint64)
    group, streams = stream_lists(stream, thread)
    assert group.tolist() == [0, 0, 1, 2, 3, 1]  # 0 and 1 are the legacy stream's list
    assert streams.tolist() == [1, 2, 2, 0x55]


def test_the_device_bounds_growth_by_halving(tmp_path: Path) -> None:
    # try_to_expand halves the growth while the upstream refuses: with 6 MiB of device, a 1 MiB
    # request after 2 MiB in the pool asks for max(1 MiB, 2 MiB) = 2 MiB ... which fits; a second
    # 4 MiB request asks for 4 MiB (max(4, 4)), refused (2 + 2 + 4 > 6): it fails, as RMM's would.
    mib = 1 << 20
    tr = _trace(tmp_path, [("a", 0, 2 * mib, 0), ("a", 1, mib, 0), ("a", 2, 4 * mib, 0)])
    run, *_ = _run(tr, device_total=6 * mib)
    assert run.rows_size.tolist() == [2 * mib, 2 * mib]
    assert run.stats[Stat.FIRST_OOM] == 2


def test_options_are_checked(tmp_path: Path) -> None:
    from tracekit.errors import UsageError

    tr = _trace(tmp_path, [("a", 0, 1, 0)])
    with pytest.raises(UsageError, match="unknown rmm-pool option 'ties'"):
        MODEL.run(tr, SimConfig(options={"ties": "x"}))
    with pytest.raises(UsageError, match="initial_pool_size"):
        MODEL.run(tr, SimConfig(options={"initial_pool_size": "lots"}))
    with pytest.raises(UsageError, match="does not fit the device"):
        MODEL.run(tr, SimConfig(device_total=1 << 20, options={"initial_pool_size": "1GiB"}))


_steps = st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 14), st.sampled_from([0, 1, 2, 0x30, 0x40]),
                            st.integers(0, 40)), min_size=1, max_size=60)


def _from_draws(draws: list[tuple[bool, int, int, int]]) -> list[Step]:
    """Requests and frees (a free closes the live block at the drawn position, on the drawn stream)."""
    out: list[Step] = []
    live: list[int] = []
    for k, (alloc, size, stream, pick) in enumerate(draws):
        if alloc or not live:
            out.append(("a", k, size + 1, stream))
            live.append(k)
        else:
            out.append(("f", live.pop(pick % len(live)), stream))
    return out


@settings(max_examples=60, deadline=None)
@given(draws=_steps, maximum=st.one_of(st.none(), st.integers(1, 1 << 8).map(lambda k: k * 768)),
       initial=st.sampled_from([0, 4096, 1 << 16]))
def test_invariants(tmp_path_factory: pytest.TempPathFactory, draws: list[tuple[bool, int, int, int]],
                    maximum: int | None, initial: int) -> None:
    steps = _from_draws(draws)
    tr = _trace(tmp_path_factory.mktemp("p"), steps)
    cfg = SimConfig(capacity=maximum, continue_on_oom=True, options={"initial_pool_size": str(initial)})
    run, C, S, found = MODEL.run_with_state(tr, cfg)
    ev = tr.events
    # Upstream blocks as the rows leave them before each input index (a full pool under a maximum
    # gives wholly free blocks back: reclaim_free_blocks).
    rows_at = list(zip(run.rows_before.tolist(), run.rows_op.tolist(), run.rows_addr.tolist(),
                       run.rows_size.tolist(), strict=True))
    held: dict[int, int] = {}  # upstream block address -> bytes
    r = 0
    peak = 0
    live: dict[int, tuple[int, int]] = {}  # input index -> (addr, bytes)
    for i in range(len(ev)):
        while r < len(rows_at) and rows_at[r][0] <= i:
            _, op, addr, n = rows_at[r]
            if op == Op.SEGMENT_ALLOC:
                assert all(addr + n <= s or s + m <= addr for s, m in held.items())  # blocks never overlap
                held[addr] = n
            else:
                assert op == Op.SEGMENT_FREE and held.pop(addr) == n
                assert all(not (addr <= a < addr + n) for a, _ in live.values())  # only a wholly free block
            peak = max(peak, sum(held.values()))
            r += 1
        if run.status[i] == Status.DONE and ev.op[i] == 0:
            a, b = int(run.addr[i]), int(run.rounded[i])
            assert a % 256 == 0 and b % 256 == 0 and b >= int(ev.size[i])  # aligned
            assert any(s <= a and a + b <= s + n for s, n in held.items())  # inside one upstream block
            for a2, b2 in live.values():  # no overlap with any live block
                assert a + b <= a2 or a2 + b2 <= a
            live[i] = (a, b)
        elif run.status[i] == Status.DONE and ev.op[i] == 1:
            live.pop(int(tr.mate[i]))
    rows = C[: S[Slot.HW]]
    rows = rows[rows[:, F.STATE] != P.DEAD]
    used = int(rows[rows[:, F.STATE] == P.USED, F.SIZE].sum())
    assert used == sum(b for _, b in live.values()) == S[Slot.LIVE]  # live bytes conserved
    assert r == len(rows_at)  # every row lands before an input event: none after the last
    assert int(rows[:, F.SIZE].sum()) == S[Slot.RESERVED] == sum(held.values())  # pieces tile the pool
    assert run.stats[Stat.PEAK_RESERVED] == peak  # the pool shrinks only by reclaiming, under a maximum
    if maximum is None:
        assert not (run.rows_op == Op.SEGMENT_FREE).any()
    else:  # remaining is aligned up, so the pool may pass M by less than 256 B
        assert peak < maximum + 256 or initial > maximum
    oom = run.status == Status.OOM
    assert found[Found.FAILED] == int(oom.sum())
    if maximum is None:
        assert not oom.any()  # nothing bounds an unlimited pool without a device total
