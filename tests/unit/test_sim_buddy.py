"""The binary buddy policy: worked splits and merges, properties against a slow reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sim_freelist import SIZES, make_trace, steps_strategy

from tracekit.sim.base import SimConfig, Stat, Status
from tracekit.sim.engine import replay
from tracekit.sim.heap import UNBOUNDED
from tracekit.sim.output import replay_events
from tracekit.sim.policies.buddy import block_order
from tracekit.trace.schema import Op


def order_of(size: int) -> int:
    k = 9
    while (1 << k) < size:
        k += 1
    return k


class RefBuddy:
    """Free blocks as one Python set of addresses per order."""

    def __init__(self, cap: int) -> None:
        self.cap = cap // 512 * 512
        self.free: dict[int, set[int]] = {k: set() for k in range(9, 63)}
        a, rest = 0, self.cap
        while rest >= 512:
            k = rest.bit_length() - 1
            self.free[k].add(a)
            a, rest = a + (1 << k), rest - (1 << k)

    def alloc(self, k: int) -> int | None:
        j = next((j for j in range(k, 63) if self.free[j]), None)
        if j is None:
            return None
        a = min(self.free[j])
        self.free[j].remove(a)
        while j > k:
            j -= 1
            self.free[j].add(a + (1 << j))
        return a

    def release(self, a: int, k: int) -> None:
        while k < 62 and (a ^ (1 << k)) in self.free[k]:
            self.free[k].remove(a ^ (1 << k))
            a = min(a, a ^ (1 << k))
            k += 1
        self.free[k].add(a)

    def check(self, used: dict[int, int]) -> None:
        spans = sorted([(a, 1 << k, True) for k, s in self.free.items() for a in s]
                       + [(a, 1 << k, False) for a, k in used.items()])
        pos = 0
        for a, size, _ in spans:
            assert a == pos and a % size == 0, "blocks must tile the heap, aligned"
            pos += size
        assert pos == self.cap
        for k, s in self.free.items():
            for a in s:
                assert (a ^ (1 << k)) not in s, "a free block beside its free buddy"


def check_buddy(trace, cap: int | None, cont: bool) -> None:
    res = replay(trace, "buddy", SimConfig(capacity=cap, continue_on_oom=cont, stop_at_first_oom=True))
    ref = RefBuddy(UNBOUNDED if cap is None else cap)
    ev = trace.events
    used: dict[int, int] = {}
    addr: dict[int, int] = {}
    status = np.zeros(len(ev), np.int8)
    live = peak = ooms = 0
    for i in range(len(ev)):
        if ev.op[i] in (Op.MALLOC, Op.OOM):
            k = order_of(int(ev.size[i]))
            a = ref.alloc(k)
            if a is None:
                status[i] = Status.OOM
                if ooms == 0:
                    oom = res.summary.oom
                    assert oom is not None and oom.seq == i and oom.live_bytes == live
                    top = max((j for j, s in ref.free.items() if s), default=None)
                    assert oom.largest_free_block == (0 if top is None else 1 << top) < oom.rounded
                ooms += 1
                if not cont:
                    break
                continue
            status[i], addr[i], used[a] = Status.DONE, a, k
            live += 1 << k
            peak = max(peak, live)
            assert res.run.addr[i] == a
        elif ev.op[i] == Op.FREE:
            m = int(trace.mate[i])
            if status[m] != Status.DONE:
                status[i] = Status.SKIPPED
                continue
            ref.release(addr[m], used.pop(addr[m]))
            live -= 1 << order_of(int(ev.size[m]))
            status[i] = Status.DONE
        ref.check(used)
    np.testing.assert_array_equal(res.run.status, status)
    assert res.run.stats[Stat.PEAK_LIVE] == peak
    assert res.summary.oom_count == ooms
    out, _ = replay_events(res.run, trace)
    assert out.op[0] == Op.SEGMENT_ALLOC


@settings(max_examples=150, deadline=None)
@given(steps=steps_strategy(SIZES), cap=st.sampled_from([None, 0, 4096, 6144, 8192, 10_000, 24576]),
       cont=st.booleans())
def test_buddy_matches_reference(steps, cap, cont) -> None:
    check_buddy(make_trace(steps), cap, cont)


def test_block_order_is_exact() -> None:
    sizes = np.array([0, 1, 512, 513, 1024, 1025, 2**40, 2**40 + 1, 2**53 + 1, 2**62], np.int64)
    assert block_order(sizes).tolist() == [9, 9, 9, 10, 10, 11, 40, 41, 54, 62]


def test_worked_split_and_merge() -> None:
    # 8 KiB heap. 1000 B -> order 10: 8K splits to 4K, 2K, 1K free halves; block at 0.
    # 2048 takes the free 2K at 2048; 512 splits the free 1K at 1024 -> block 1024, 1536 free.
    # Freeing the 2K at 2048 cannot merge (its buddy at 0 is split), nor can freeing 0 (its
    # buddy 1024 is split); 100 B takes the 512 B block at 1536.
    steps = [("m", 1000), ("m", 2048), ("m", 512), ("f", 1), ("m", 4096), ("f", 0), ("m", 100)]
    res = replay(make_trace(steps), "buddy", SimConfig(capacity=8192))
    assert res.run.addr.tolist() == [0, 2048, 1024, 0, 4096, 0, 1536]  # frees: 0
    assert res.run.rounded.tolist() == [1024, 2048, 512, 2048, 4096, 1024, 512]


def test_full_merge_restores_the_heap() -> None:
    steps = [("m", 512), ("m", 512), ("m", 1024), ("f", 0), ("f", 2), ("f", 1), ("m", 4096)]
    res = replay(make_trace(steps), "buddy", SimConfig(capacity=4096))
    assert res.summary.oom is None and res.run.addr[-1] == 0


def test_internal_waste_is_counted_in_live_bytes() -> None:
    # 3 KiB rounds to a 4 KiB block: two of them do not fit in 6 KiB (4K + 2K top blocks).
    res = replay(make_trace([("m", 3072), ("m", 3072)]), "buddy", SimConfig(capacity=6144))
    oom = res.summary.oom
    assert oom is not None and oom.rounded == 4096 and oom.live_bytes == 4096
    assert oom.free_bytes == 2048 and oom.largest_free_block == 2048


@pytest.mark.parametrize("cap", [None, 1 << 30])
def test_options_are_refused(cap) -> None:
    from tracekit.errors import UsageError

    with pytest.raises(UsageError):
        replay(make_trace([("m", 1)]), "buddy", SimConfig(capacity=cap, options={"x": "1"}))
