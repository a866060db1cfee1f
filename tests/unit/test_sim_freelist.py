"""The address-ordered free list: worked examples and properties against a slow reference.

The reference below is the textbook structure written as plainly as possible:
a Python list of ``[addr, size, free]`` blocks tiling ``[0, capacity)`` in
address order, searched linearly. The compiled policies must place every
request at the same address, fail exactly the same requests, and report the
same peaks; the reference checks the invariants after every step.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.sim.base import SimConfig, Stat, Status
from tracekit.sim.engine import replay
from tracekit.sim.heap import UNBOUNDED
from tracekit.sim.output import replay_events
from tracekit.trace.events import Events
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op, Source, TraceMeta
from tracekit.trace.validate import pair_events

POLICIES = ("first-fit", "best-fit", "next-fit", "worst-fit")


def make_trace(steps: list[tuple[str, int]]) -> Trace:
    """("m", size) allocates (input address unique per malloc); ("f", j) frees the j-th malloc;
    ("o", size) is a recorded failed request: the reference replays every one as a plain attempt,
    as ``stop_at_first_oom`` does (handled ones: tests/unit/test_sim_handled_oom.py)."""
    op, size, addr, where = [], [], [], []
    for kind, v in steps:
        if kind == "m":
            where.append(len(op))
            op.append(Op.MALLOC)
            size.append(v)
            addr.append(0x1000 * (len(where)))
        elif kind == "o":
            op.append(Op.OOM)
            size.append(v)
            addr.append(0)
        else:
            i = where[v]
            op.append(Op.FREE)
            size.append(size[i])
            addr.append(addr[i])
    ev = Events.build(np.array(op, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64))
    pairing = pair_events(ev.op, ev.addr, ev.device, ev.seq)
    assert not pairing.issues
    return Trace(None, TraceMeta.new(Source.SYNTHETIC), ev, pairing.mate, None, ())


def rnd(size: int) -> int:
    return max(512, -(-size // 512) * 512)


class RefFreeList:
    """Slow, obvious free list over [0, cap)."""

    def __init__(self, policy: str, cap: int, grows: bool = False) -> None:
        self.policy, self.cap, self.grows = policy, cap, grows
        self.blocks = [[0, cap, True]] if cap > 0 else []
        self.rover = 0

    def alloc(self, r: int) -> int | None:
        free = [b for b in self.blocks if b[2] and b[1] >= r]
        if not free:
            return None
        # An unbounded heap grows (takes the free space at its top) only when nothing else fits.
        if self.grows and len(free) > 1 and free[-1][0] + free[-1][1] == self.cap:
            free = free[:-1]
        if self.policy == "first-fit":
            pick = min(free, key=lambda b: b[0])
        elif self.policy == "best-fit":
            pick = min(free, key=lambda b: (b[1], b[0]))
        elif self.policy == "worst-fit":
            pick = min(free, key=lambda b: (-b[1], b[0]))
        else:
            start = self.rover
            for b in self.blocks:
                if b[2] and b[0] <= self.rover < b[0] + b[1]:
                    start = b[0]
            after = [b for b in free if b[0] >= start]
            pick = min(after or free, key=lambda b: b[0])
        i = self.blocks.index(pick)
        a, size = pick[0], pick[1]
        self.blocks[i] = [a, r, False]
        if size > r:
            self.blocks.insert(i + 1, [a + r, size - r, True])
        self.rover = a + r
        return a

    def free(self, a: int) -> None:
        i = next(k for k, b in enumerate(self.blocks) if b[0] == a and not b[2])
        self.blocks[i][2] = True
        if i + 1 < len(self.blocks) and self.blocks[i + 1][2]:
            self.blocks[i][1] += self.blocks.pop(i + 1)[1]
        if i > 0 and self.blocks[i - 1][2]:
            self.blocks[i - 1][1] += self.blocks.pop(i)[1]

    def largest(self) -> int:
        return max([b[1] for b in self.blocks if b[2]], default=0)

    def check(self, live: int) -> None:
        pos = 0
        for k, (a, s, f) in enumerate(self.blocks):
            assert a == pos and s > 0
            pos += s
            if k and f:
                assert not self.blocks[k - 1][2], "two adjacent free blocks"
        assert pos == self.cap, "blocks do not tile the heap"
        used = sum(s for _, s, f in self.blocks if not f)
        free = sum(s for _, s, f in self.blocks if f)
        assert used == live and used + free == self.cap


def reference(trace: Trace, policy: str, cap: int, cont: bool, grows: bool = False) -> dict:
    ref = RefFreeList(policy, cap, grows)
    ev = trace.events
    n = len(ev)
    addr = np.zeros(n, np.int64)
    status = np.zeros(n, np.int8)
    live = peak_live = extent = ooms = 0
    first: dict | None = None
    for i in range(n):
        if ev.op[i] in (Op.MALLOC, Op.OOM):
            r = rnd(int(ev.size[i]))
            a = ref.alloc(r)
            if a is None:
                status[i] = Status.OOM
                ooms += 1
                if first is None:
                    first = {"i": i, "free": cap - live, "largest": ref.largest(), "live": live}
                if not cont:
                    break
                continue
            addr[i], status[i] = a, Status.DONE
            live += r
            peak_live, extent = max(peak_live, live), max(extent, a + r)
        elif ev.op[i] == Op.FREE:
            m = int(trace.mate[i])
            if status[m] != Status.DONE:
                status[i] = Status.SKIPPED
                continue
            ref.free(int(addr[m]))
            live -= rnd(int(ev.size[m]))
            status[i] = Status.DONE
        ref.check(live)
    return {"addr": addr, "status": status, "peak_live": peak_live, "extent": extent, "ooms": ooms,
            "first": first}


def check_against_reference(trace: Trace, policy: str, cap: int | None, cont: bool) -> None:
    res = replay(trace, policy, SimConfig(capacity=cap, continue_on_oom=cont, stop_at_first_oom=True))
    exp = reference(trace, policy, UNBOUNDED if cap is None else cap, cont, grows=cap is None)
    run = res.run
    np.testing.assert_array_equal(run.status, exp["status"])
    done = run.status == Status.DONE
    np.testing.assert_array_equal(run.addr[done & (trace.events.op == Op.MALLOC)].astype(np.int64),
                                  exp["addr"][done & (trace.events.op == Op.MALLOC)])
    s = run.stats
    assert s[Stat.PEAK_LIVE] == exp["peak_live"]
    assert s[Stat.PEAK_EXTENT] == exp["extent"] == res.summary.peak_reserved_bytes
    assert s[Stat.OOMS] == exp["ooms"] == res.summary.oom_count
    first = exp["first"]
    if first is None:
        assert s[Stat.FIRST_OOM] == -1 and res.summary.oom is None
    else:
        assert s[Stat.FIRST_OOM] == first["i"]
        oom = res.summary.oom
        assert oom is not None
        assert oom.free_bytes == first["free"]
        assert oom.largest_free_block == first["largest"]
        assert oom.live_bytes == first["live"]
        # an OOM only when no free block can hold the request
        assert oom.largest_free_block < oom.rounded
    check_output(trace, res, UNBOUNDED if cap is None else cap)


def check_output(trace: Trace, res, cap: int) -> None:
    """Invariants read off the written replay: live blocks never overlap, all within the heap."""
    out, _ = replay_events(res.run, trace)
    assert out.op[0] == Op.SEGMENT_ALLOC and out.addr[0] == 0
    live: dict[int, int] = {}
    for o, a, r, s in zip(out.op.tolist(), out.addr.tolist(), out.rounded.tolist(), out.size.tolist(),
                          strict=True):
        if o == Op.MALLOC:
            assert r % 512 == 0 and a % 512 == 0 and a >= 0 and a + r <= cap
            for b, q in live.items():
                assert a + r <= b or b + q <= a, "live blocks overlap"
            live[a] = r
        elif o == Op.FREE:
            assert live.pop(a) == s


def steps_strategy(sizes: st.SearchStrategy[int], max_len: int = 60) -> st.SearchStrategy:
    @st.composite
    def build(draw: st.DrawFn) -> list[tuple[str, int]]:
        out: list[tuple[str, int]] = []
        live: list[int] = []
        count = 0
        for _ in range(draw(st.integers(1, max_len))):
            action = draw(st.sampled_from("mmmffo"))
            if action == "f" and live:
                out.append(("f", live.pop(draw(st.integers(0, len(live) - 1)))))
            elif action == "o":
                out.append(("o", draw(sizes)))
            else:
                out.append(("m", draw(sizes)))
                live.append(count)
                count += 1
        return out

    return build()


SIZES = st.one_of(
    st.sampled_from([1, 100, 512, 513, 1024, 1536, 2048, 3000, 4096, 8192]),
    st.integers(1, 6000),
)


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=120, deadline=None)
@given(steps=steps_strategy(SIZES), cap=st.sampled_from([None, 0, 4096, 8192, 10_000, 16384]),
       cont=st.booleans())
def test_policy_matches_reference(policy: str, steps, cap, cont) -> None:
    check_against_reference(make_trace(steps), policy, cap, cont)


# Worked example. Capacity 8 KiB; every request rounds to a multiple of 512.
#   0 malloc 1000 -> [0, 1024)        1 malloc 2048 -> [1024, 3072)
#   2 malloc  512 -> [3072, 3584)     3 free #1     -> hole [1024, 3072) (2 KiB)
#   4 malloc 4096 -> [3584, 7680): the 2 KiB hole is too small for every policy
#   5 free #0     -> hole [0, 3072) (3 KiB, merged); the tail [7680, 8192) is 512 B
#   6 malloc  100 (512 B): first fit takes 0 (lowest address), best fit 7680
#     (smallest block that fits), next fit 7680 (the rover sits at 7680, the end
#     of #4), worst fit 0 (the 3 KiB hole is the largest).
WORKED = [("m", 1000), ("m", 2048), ("m", 512), ("f", 1), ("m", 4096), ("f", 0), ("m", 100)]


@pytest.mark.parametrize("policy,last", [("first-fit", 0), ("best-fit", 7680), ("next-fit", 7680),
                                         ("worst-fit", 0)])
def test_worked_example(policy: str, last: int) -> None:
    res = replay(make_trace(WORKED), policy, SimConfig(capacity=8192))
    assert res.run.addr.tolist() == [0, 1024, 3072, 0, 3584, 0, last]
    assert res.summary.oom is None


def test_worked_example_peak_and_extent() -> None:
    # live after #4: 1024 + 512 + 4096 = 5632 (#1 freed); before that 3584. Peak 5632.
    res = replay(make_trace(WORKED), "first-fit", SimConfig(capacity=8192))
    assert res.summary.peak_live_bytes == 5632
    assert res.summary.peak_extent == 7680  # #4 ends at 7680; #6 lands at 0


def test_worst_fit_differs_from_first_fit() -> None:
    # Holes of 1 KiB at 0 and 2 KiB at 1536 (a 512-byte block between them).
    steps = [("m", 1024), ("m", 512), ("m", 2048), ("m", 512), ("f", 0), ("f", 2), ("m", 512)]
    cap = 1024 + 512 + 2048 + 512
    first = replay(make_trace(steps), "first-fit", SimConfig(capacity=cap)).run.addr[-1]
    worst = replay(make_trace(steps), "worst-fit", SimConfig(capacity=cap)).run.addr[-1]
    best = replay(make_trace(steps), "best-fit", SimConfig(capacity=cap)).run.addr[-1]
    assert (first, best, worst) == (0, 0, 1536)


def test_fragmentation_oom_is_explained() -> None:
    # 4 KiB heap: four 1 KiB blocks, free #0 and #2 -> 2 KiB free in two 1 KiB holes.
    steps = [("m", 1024)] * 4 + [("f", 0), ("f", 2), ("m", 2048)]
    res = replay(make_trace(steps), "best-fit", SimConfig(capacity=4096))
    oom = res.summary.oom
    assert oom is not None and oom.seq == 6 and oom.size == 2048
    assert (oom.free_bytes, oom.largest_free_block, oom.live_bytes, oom.reserved_bytes) == \
        (2048, 1024, 2048, 4096)
    assert oom.cause == "fragmentation"
    assert res.summary.stopped


def test_stop_and_continue_on_oom() -> None:
    # #1 (6 KiB) cannot fit next to #0 (4 KiB) in 8 KiB; its free is skipped when going on.
    steps = [("m", 4096), ("m", 6144), ("f", 1), ("m", 4096), ("f", 0)]
    stop = replay(make_trace(steps), "first-fit", SimConfig(capacity=8192))
    assert stop.run.status.tolist() == [Status.DONE, Status.OOM, 0, 0, 0]
    go = replay(make_trace(steps), "first-fit", SimConfig(capacity=8192, continue_on_oom=True))
    assert go.run.status.tolist() == [Status.DONE, Status.OOM, Status.SKIPPED, Status.DONE, Status.DONE]
    assert go.run.addr[3] == 4096 and go.summary.oom_count == 1


@pytest.mark.parametrize("policy", POLICIES)
def test_unbounded_heap_grows_only_when_nothing_fits(policy: str) -> None:
    # A 4 KiB hole at 0 below a 512 B block: every policy reuses it before growing the heap.
    steps = [("m", 4096), ("m", 512), ("f", 0), ("m", 1024), ("m", 2048)]
    res = replay(make_trace(steps), policy, SimConfig())
    assert res.run.addr[3:].tolist() == [0, 1024] and res.summary.peak_extent == 4608


def test_unbounded_heap_never_fails_and_segment_is_rounded() -> None:
    res = replay(make_trace([("m", 3 << 20), ("m", 10)]), "best-fit", SimConfig())
    assert res.summary.oom is None and res.summary.peak_extent == (3 << 20) + 512
    assert res.run.rows_size.tolist() == [4 << 20]  # rounded up to 2 MiB


def test_options_are_refused() -> None:
    from tracekit.errors import UsageError

    with pytest.raises(UsageError, match="takes no options"):
        replay(make_trace([("m", 1)]), "first-fit", SimConfig(options={"max_split_size_mb": "1"}))


def test_large_random_trace_matches_reference_in_chunks(monkeypatch) -> None:
    # A few thousand events through several kernel chunks (state carried across calls).
    from tracekit import progress

    monkeypatch.setattr(progress, "CHUNK", 97)
    rng = np.random.default_rng(7)
    steps: list[tuple[str, int]] = []
    live: list[int] = []
    count = 0
    for _ in range(3000):
        if live and rng.random() < 0.48:
            steps.append(("f", live.pop(int(rng.integers(len(live))))))
        else:
            steps.append(("m", int(np.exp(rng.uniform(0, np.log(1 << 20))))))
            live.append(count)
            count += 1
    trace = make_trace(steps)
    for policy in POLICIES:
        check_against_reference(trace, policy, 48 << 20, True)


# Sizes around 32-64 MiB fall in the shared (non-exact) size classes of best fit,
# where the smallest fitting block may be in the request's own class or the next.
# One shared class spans 512 KiB here: [48 MiB, 48.5 MiB) is a single class.
BIG = st.one_of(st.integers(48 << 20, (48 << 20) + (1 << 19)), st.integers(30 << 20, 70 << 20),
                st.sampled_from([32 << 20, (32 << 20) - 512, 48 << 20]))


@pytest.mark.parametrize("policy", ["best-fit", "worst-fit"])
@settings(max_examples=80, deadline=None)
@given(steps=steps_strategy(BIG, max_len=40), cap=st.sampled_from([None, 200 << 20, 300 << 20]))
def test_large_blocks_match_reference(policy: str, steps, cap) -> None:
    check_against_reference(make_trace(steps), policy, cap, True)


def test_size_classes_are_monotone_and_the_bitmap_finds_the_next() -> None:
    from tracekit.sim import sizeclass as sc

    sizes = np.unique(np.r_[np.arange(0, 1 << 22, 512), (np.int64(1) << np.arange(9, 62)),
                            (np.int64(1) << np.arange(10, 62)) - 512])
    classes = np.array([sc.klass(int(s)) for s in sizes])
    assert np.all(np.diff(classes) >= 0) and classes.max() < sc.NCLASSES
    rng = np.random.default_rng(3)
    for _ in range(20):
        _roots, bm = sc.new_tables()
        on = np.unique(rng.integers(0, sc.NCLASSES, int(rng.integers(0, 40))))
        for c in on:
            sc._set(bm, int(c))
        for c in [*rng.integers(0, sc.NCLASSES, 200).tolist(), 0, sc.NCLASSES - 1]:
            later = on[on >= c]
            assert sc.next_class(bm, c) == (int(later[0]) if len(later) else -1)
        assert sc.last_class(bm) == (int(on[-1]) if len(on) else -1)
        for c in on:
            sc._clear(bm, int(c))
        assert not bm.any()


def test_best_fit_skips_a_too_small_block_of_the_same_class() -> None:
    # 48 MiB + 100 KiB and 48 MiB + 300 KiB share a size class; after freeing the first,
    # a request of 48 MiB + 200 KiB must skip that hole and take the next best fit.
    kib = 1 << 10
    a, b, c = (48 << 20) + 100 * kib, (48 << 20) + 300 * kib, (48 << 20) + 200 * kib
    steps = [("m", a), ("m", 1), ("m", b), ("m", 1), ("f", 0), ("f", 2), ("m", c)]
    res = replay(make_trace(steps), "best-fit", SimConfig(capacity=a + b + 1024 + (60 << 20)))
    assert res.run.addr[-1] == a + 512  # the freed b-sized hole, not the smaller a-sized one
