"""The device-allocator policies ``cuda`` (plain cudaMalloc) and ``cupy-async`` (MemoryAsyncPool).

Worked answers on tiny traces (sizes in bytes, MiB = 2**20):

- requests 1000 B, 3 MiB, 1 MiB + 1 B, free the 3 MiB block, 512 B. cudaMalloc is charged
  1024 B, 4 MiB, 2 MiB, 512 B (512-byte steps up to 1 MiB, whole 2 MiB pages above), so its
  reserved bytes peak at 6 MiB + 1 KiB and it places the blocks at 2**40, 2**40 + 2 MiB
  (2 MiB boundary), 2**40 + 6 MiB and 2**40 + 8 MiB. The async pool packs the live bytes
  (1 KiB, 3 MiB + 1 KiB, 4 MiB + 1.5 KiB) into pages: 2, 4, 6 MiB, and keeps the 6 MiB after
  the free. Under 6 MiB cudaMalloc fails the third request (4 MiB + 1 KiB + 2 MiB > 6 MiB,
  2 MiB - 1 KiB free, of which 1 MiB is the largest request it could serve); under 5 MiB the
  async pool does (6 MiB of pages > 5 MiB).
- the pool keeps what it mapped: 10 MiB, free, 1 MiB, then 20 MiB under a 20 MiB capacity
  fails for both, with 1 MiB reserved by cudaMalloc (the 10 MiB went back) and 10 MiB by the
  async pool.

Properties (hypothesis) on random traces: blocks never overlap; the verdict is the footprint
rule and the peaks are its figures (reserved >= live at the device's granularity); after every
block is freed a request of the whole capacity fits.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit.errors import UsageError
from tracekit.sim import policies
from tracekit.sim.base import Allocator, Basis, Layout, SimConfig, Stat, Status
from tracekit.sim.engine import replay
from tracekit.trace import Events, Op, Source, Trace, TraceMeta
from tracekit.trace.validate import pair_events

KIB, MIB = 1 << 10, 1 << 20
PAGE = 2 * MIB
BASE = 1 << 40
DEVICE = ("cuda", "cupy-async")


def mk(rows: list[tuple[str, int]]) -> Trace:
    """("m", bytes) allocates; ("f", k) frees the k-th malloc of the trace (0-based)."""
    op, size, addr = [], [], []
    mallocs: list[int] = []
    for kind, v in rows:
        if kind == "m":
            mallocs.append(0x1000 * (len(mallocs) + 1))
            op.append(Op.MALLOC)
            size.append(v)
            addr.append(mallocs[-1])
        else:
            op.append(Op.FREE)
            size.append(0)
            addr.append(mallocs[v])
    ev = Events.build(np.array(op, np.int8), np.array(size, np.uint64), addr=np.array(addr, np.uint64))
    mate = pair_events(ev.op, ev.addr, ev.device, ev.seq).mate
    return Trace(None, TraceMeta.new(Source.SYNTHETIC), ev, mate, None, ())


WORKED = [("m", 1000), ("m", 3 * MIB), ("m", MIB + 1), ("f", 1), ("m", 512)]


def test_registry_describes_them() -> None:
    assert policies.modelling(Allocator.CUDA) == "cuda"
    assert policies.modelling(Allocator.CUPY_ASYNC) == "cupy-async"
    for name in DEVICE:
        t = policies.traits(name)
        assert t is not None and t.layout == Layout.POOL and t.basis == Basis.FOOTPRINT
        assert not t.whatif and not t.recorded_limit and t.reproduces is None
    assert all(policies.traits(n).basis == Basis.PLACEMENT for n in policies.names() if n not in DEVICE)  # type: ignore[union-attr]


def test_cuda_worked_trace() -> None:
    res = replay(mk(WORKED), "cuda")
    s = res.summary
    assert (s.peak_reserved_bytes, s.peak_live_bytes) == (6 * MIB + KIB, 4 * MIB + 1536)
    assert (s.segment_allocs, s.segment_frees, s.oom) == (0, 0, None)  # each request is the device call
    assert res.run.addr.tolist() == [BASE, BASE + 2 * MIB, BASE + 6 * MIB, 0, BASE + 8 * MIB]
    assert res.run.rounded is not None and res.run.rounded.tolist() == [1024, 3 * MIB, MIB + 512, 0, 512]


def test_cuda_fails_when_the_device_bytes_run_out() -> None:
    s = replay(mk(WORKED), "cuda", SimConfig(capacity=6 * MIB)).summary
    assert s.oom is not None and s.oom.seq == 2 and s.stopped
    assert (s.oom.free_bytes, s.oom.largest_free_block) == (2 * MIB - KIB, MIB)
    assert (s.oom.live_bytes, s.oom.reserved_bytes) == (3 * MIB + KIB, 4 * MIB + KIB)
    assert s.oom.rounded == MIB + 512
    assert replay(mk(WORKED), "cuda", SimConfig(capacity=6 * MIB + KIB)).summary.oom is None  # to the byte


def test_async_pool_worked_trace() -> None:
    s = replay(mk(WORKED), "cupy-async").summary
    assert (s.peak_reserved_bytes, s.peak_live_bytes) == (6 * MIB, 4 * MIB + 1536)
    s = replay(mk(WORKED), "cupy-async", SimConfig(capacity=5 * MIB)).summary
    assert s.oom is not None and s.oom.seq == 2
    assert (s.oom.live_bytes, s.oom.reserved_bytes) == (3 * MIB + KIB, 4 * MIB)
    assert (s.oom.free_bytes, s.oom.largest_free_block) == (MIB - KIB, MIB - KIB)
    assert replay(mk(WORKED), "cupy-async", SimConfig(capacity=6 * MIB)).summary.oom is None


def test_the_async_pool_keeps_what_it_mapped() -> None:
    t = mk([("m", 10 * MIB), ("f", 0), ("m", MIB), ("m", 20 * MIB)])
    cuda = replay(t, "cuda", SimConfig(capacity=20 * MIB)).summary.oom
    pool = replay(t, "cupy-async", SimConfig(capacity=20 * MIB)).summary.oom
    assert cuda is not None and pool is not None and cuda.seq == pool.seq == 3
    assert (cuda.reserved_bytes, pool.reserved_bytes) == (MIB, 10 * MIB)


def test_the_smaller_of_capacity_and_device_total_bounds_and_continue_goes_on() -> None:
    t = mk(WORKED)
    s = replay(t, "cuda", SimConfig(capacity=64 * MIB, device_total=6 * MIB, continue_on_oom=True)).summary
    # the 1 MiB + 1 B request fails; its block is skipped and the 512 B request still fits
    assert s.oom is not None and s.oom.seq == 2 and s.oom_count == 1 and not s.stopped
    assert s.peak_reserved_bytes == 4 * MIB + KIB


def test_zero_bytes_is_a_null_pointer_and_options_are_refused() -> None:
    res = replay(mk([("m", 0), ("f", 0)]), "cupy-async", SimConfig(capacity=1))
    assert res.summary.oom is None and res.run.addr.tolist() == [0, 0]
    assert res.run.status.tolist() == [Status.DONE, Status.DONE]
    with pytest.raises(UsageError, match="cuda takes no options"):
        replay(mk(WORKED), "cuda", SimConfig(options={"ties": "address"}))


# -- properties ------------------------------------------------------------------------------------

step = st.one_of(st.tuples(st.just("m"), st.sampled_from([0, 1, 511, 512, 4000, MIB, MIB + 1, 3 * MIB,
                                                          5 * MIB + 7, 9 * MIB])),
                 st.tuples(st.just("f"), st.integers(0, 99)))


def rows_of(steps: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Steps as ``mk`` rows: a free frees the (k mod live)-th live malloc (a malloc when none is)."""
    rows: list[tuple[str, int]] = []
    live: list[int] = []
    n = 0
    for kind, v in steps:
        if kind == "m" or not live:
            rows.append(("m", v if kind == "m" else 1))
            live.append(n)
            n += 1
        else:
            rows.append(("f", live.pop(v % len(live))))
    return rows


def cost(name: str, s: int) -> int:
    r = -(-s // 512) * 512
    return r if name == "cupy-async" or s <= MIB else -(-s // PAGE) * PAGE


def check(name: str, t: Trace, cfg: SimConfig) -> None:
    """Walk the replay in order against the footprint rule, an independent statement of it."""
    res = replay(t, name, cfg)
    ev, st_, addr = t.events, res.run.status, res.run.addr.astype(np.int64)
    bound = min(b for b in (cfg.capacity, cfg.device_total, 1 << 62) if b is not None)
    live: dict[int, tuple[int, int]] = {}  # malloc row -> (addr, size)
    held = used = reserved = peak_res = peak_live = 0
    stopped = False
    for i in range(len(ev)):
        if stopped:
            assert st_[i] == Status.IGNORED
            continue
        s = int(ev.size[i])
        if ev.op[i] == Op.FREE:
            m = int(t.mate[i])
            if m in live:
                assert st_[i] == Status.DONE
                held -= -(-int(ev.size[m]) // 512) * 512
                used -= cost(name, int(ev.size[m]))
                del live[m]
            else:
                assert st_[i] == Status.SKIPPED
            reserved = used if name == "cuda" else reserved
            continue
        r, c = -(-s // 512) * 512, cost(name, s)
        need = used + c if name == "cuda" else max(reserved, -(-(held + r) // PAGE) * PAGE)
        if s and need > bound:
            assert st_[i] == Status.OOM
            stopped = not cfg.continue_on_oom
            continue
        assert st_[i] == Status.DONE
        a = int(addr[i])
        for b, n in live.values():  # a live block never overlaps another
            assert a + s <= b or b + n <= a or s == 0 or n == 0
        if s > MIB and name == "cuda":
            assert a % PAGE == 0
        live[i] = (a, s)
        held, used = held + r, used + c
        reserved = used if name == "cuda" else max(reserved, -(-held // PAGE) * PAGE)
        peak_res, peak_live = max(peak_res, reserved), max(peak_live, held)
    stats = res.run.stats
    assert (stats[Stat.PEAK_RESERVED], stats[Stat.PEAK_LIVE]) == (peak_res, peak_live)
    assert peak_res >= peak_live  # reserved >= live at the device's granularity


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, min_size=1, max_size=40), cap_mib=st.one_of(st.none(), st.integers(1, 24)),
       go_on=st.booleans(), name=st.sampled_from(DEVICE))
def test_footprint_invariants(steps, cap_mib, go_on, name) -> None:
    cfg = SimConfig(capacity=None if cap_mib is None else cap_mib * MIB, continue_on_oom=go_on)
    check(name, mk(rows_of(steps)), cfg)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.just("m"), st.sampled_from([1, 4000, MIB + 1, 3 * MIB])), min_size=1,
                      max_size=12), name=st.sampled_from(DEVICE))
def test_frees_return_everything(steps, name) -> None:
    """Every block freed, a request of the whole (unfragmented) capacity fits; one byte more does not."""
    rows = rows_of(steps)
    k = len(rows)
    cap = sum(cost(name, v) for _, v in rows)
    cap = -(-cap // PAGE) * PAGE
    rows += [("f", j) for j in range(k)] + [("m", cap), ("m", 1)]
    s = replay(mk(rows), name, SimConfig(capacity=cap)).summary
    assert s.oom is not None and s.oom.seq == len(rows) - 1  # the last one, not the whole capacity
    assert (s.oom.live_bytes, s.oom.reserved_bytes) == (cap, cap)


def test_a_handled_attempt_stands_in_for_its_retry_or_fails_and_the_replay_goes_on() -> None:
    """4 MiB; an 8 MiB request at b.py fails in the recording and is retried as 2 MiB there, freed;
    3 MiB. Under 16 MiB the attempt is served and holds the retry's place (4 + 8 = 12 MiB at the
    peak); under 10 MiB it fails again, is counted as handled, and the retry is placed (peak 7 MiB)."""
    op = np.array([Op.MALLOC, Op.OOM, Op.MALLOC, Op.FREE, Op.MALLOC], np.int8)
    size = np.array([4, 8, 2, 0, 3], np.uint64) * MIB
    addr = np.array([0x1000, 0, 0x2000, 0x2000, 0x3000], np.uint64)
    ev = Events.build(op, size, addr=addr, site=np.array([0, 1, 1, -1, 2], np.int32),
                      sites=("a.py:1", "b.py:2", "c.py:3"))
    t = Trace(None, TraceMeta.new(Source.SYNTHETIC), ev, pair_events(ev.op, ev.addr, ev.device, ev.seq).mate,
              None, ())
    for name in DEVICE:
        big = replay(t, name, SimConfig(capacity=16 * MIB))
        assert big.summary.oom is None and big.summary.handled_ooms == 0
        assert big.run.status.tolist() == [Status.DONE, Status.TRIED, Status.DONE, Status.DONE, Status.DONE]
        assert big.run.addr[2] == big.run.addr[1] and big.summary.peak_live_bytes == 12 * MIB
        small = replay(t, name, SimConfig(capacity=10 * MIB)).summary
        assert small.oom is None and small.handled_ooms == 1 and small.peak_live_bytes == 7 * MIB
