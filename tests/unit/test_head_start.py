"""A replay started while its trace is read (``tracekit.sim.head_start``) answers as one started after.

The head start pairs each window of rows itself and replays up to the first row whose input only the
whole trace gives (an ``oom`` row, a malloc at a live address, a free of no live block, a request of
2^62 bytes or more); the answer is taken only where those rows agree with the trace as read, then
the rest is replayed from the trace's own input. Here: random traces cut into many small windows,
with each of those causes sprinkled in, replayed both ways under the four free-list policies,
bounded and not, and every array of the two runs compared.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tracekit.sim.head_start as hs
import tracekit.trace.columns as columns
import tracekit.trace.writer as writer
from tracekit.advise.replay import replay_file
from tracekit.errors import TraceFormatError
from tracekit.sim import policies
from tracekit.sim.base import PolicyRun, SimConfig
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

MiB = 1 << 20
HEAPS = ("first-fit", "best-fit", "next-fit", "worst-fit")


@pytest.fixture(autouse=True)
def small_windows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups of 200 rows read in windows of about 600: a few thousand events make many windows
    (the switch on: whatever the size)."""
    monkeypatch.setattr(writer, "ROW_GROUP", 200)
    monkeypatch.setattr(columns, "WINDOW_ROWS", 600)
    monkeypatch.setattr(hs, "_STEP", 250)  # several kernel steps a window
    monkeypatch.setenv(hs.SWITCH, "1")


def _program(seed: int, n: int, oom: float, bad: float, segments: bool, devices: int, huge: bool) -> Events:
    """A random allocation history of n rows: mallocs of log-uniform sizes (512 B - 64 MiB) at fresh
    or reused addresses, frees of random live blocks; with probability ``oom`` a row is a failed
    request, with ``bad`` a malloc at a live address or a free of a freed one (the reader drops
    them); segment rows around, blocks on ``devices`` devices, one request of 2^62 bytes (``huge``,
    which the reader refuses)."""
    rng = np.random.default_rng(seed)
    op = np.empty(n, np.int8)
    size = np.zeros(n, np.uint64)
    addr = np.zeros(n, np.uint64)
    device = np.zeros(n, np.int16)
    live: list[tuple[int, int, int]] = []  # (addr, size, device)
    freed: list[tuple[int, int, int]] = []
    top = 1 << 32
    for i in range(n):
        r = rng.random()
        if r < oom:
            op[i], size[i] = Op.OOM, int(rng.integers(1, 256)) * MiB
            device[i] = int(rng.integers(0, devices))
            continue
        if r < oom + bad and (live or freed):
            if live and rng.random() < 0.5:
                a, s, d = live[int(rng.integers(0, len(live)))]
                op[i] = Op.MALLOC  # at a live address
            elif freed:
                a, s, d = freed[int(rng.integers(0, len(freed)))]
                op[i] = Op.FREE  # of a block freed already
            else:
                a, s, d = live[0]
                op[i] = Op.MALLOC
            addr[i], size[i], device[i] = a, s, d
            continue
        if segments and r < oom + bad + 0.02:
            op[i] = Op.SEGMENT_ALLOC
            addr[i], size[i] = (1 << 48) + i * (1 << 30), 1 << 30
            continue
        if live and (rng.random() < 0.5 or len(live) > 60):
            a, s, d = live.pop(int(rng.integers(0, len(live))))
            freed.append((a, s, d))
            op[i], addr[i], size[i], device[i] = Op.FREE, a, s, d
            continue
        s = int(np.exp(rng.uniform(np.log(512), np.log(64 * MiB))))
        d = int(rng.integers(0, devices))
        if freed and rng.random() < 0.3:  # a freed address again (as allocators hand them out)
            a = freed.pop(int(rng.integers(0, len(freed))))[0]
            if any(x[0] == a and x[2] == d for x in live):
                a, top = top, top + (128 << 20)
        else:
            a, top = top, top + (128 << 20)
        live.append((a, s, d))
        op[i], addr[i], size[i], device[i] = Op.MALLOC, a, s, d
    if huge:
        at = n // 2
        op[at], size[at], addr[at] = Op.MALLOC, (1 << 62) - 512, top
    rounded = np.where(op == Op.MALLOC, size, 0).astype(np.uint64)
    return Events.build(op, size, addr=addr, rounded=rounded, device=device)


def _write(tmp: Path, name: str, ev: Events) -> Path:
    return write_trace(tmp / f"{name}.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


def _both(path: Path, policy: str, config: SimConfig) -> tuple[PolicyRun, PolicyRun | None, int]:
    """(the plain run, the head start's answer or None, the rows the head start replayed)."""
    model = policies.get(policy)
    plain = model.run(read_trace(path), config)
    with hs.head_start(model, config) as head:
        assert head is not None
        trace = read_trace(path, on_window=head.take)
        run = head.finish(trace)
        return plain, run, head.done


def _same(a: PolicyRun, b: PolicyRun) -> None:
    for field in ("addr", "status", "rounded", "stats", "rows_before", "rows_op", "rows_addr", "rows_size"):
        x, y = getattr(a, field), getattr(b, field)
        assert np.array_equal(x, y), field


def test_a_clean_trace_is_replayed_during_the_read_alike(tmp_path: Path) -> None:
    path = _write(tmp_path, "clean", _program(1, 4000, 0.0, 0.0, False, 1, False))
    for policy in HEAPS:
        plain, run, done = _both(path, policy, SimConfig())
        assert run is not None and done == 4000
        _same(plain, run)


def test_a_table_that_grows_during_the_head_start(tmp_path: Path) -> None:
    # 10,000 blocks live at once (the table of live blocks starts at 4,096 slots): the pairing stops
    # where the table must grow, mid-window, and goes on from that row.
    k = 10_000
    addr = np.concatenate([np.arange(1, k + 1, dtype=np.uint64) << np.uint64(20)] * 2)
    op = np.concatenate([np.full(k, Op.MALLOC, np.int8), np.full(k, Op.FREE, np.int8)])
    size = np.full(2 * k, 4096, np.uint64)
    rounded = np.where(op == Op.MALLOC, size, 0).astype(np.uint64)
    path = _write(tmp_path, "grows", Events.build(op, size, addr=addr, rounded=rounded))
    plain, run, done = _both(path, "best-fit", SimConfig())
    assert run is not None and done == 2 * k
    _same(plain, run)


def test_an_oom_row_stops_the_head_start_and_the_rest_is_replayed_from_the_trace(tmp_path: Path) -> None:
    ev = _program(2, 4000, 0.0, 0.0, False, 1, False)
    at = 2500  # a failed request the program survived, inserted there
    ev = Events.build(np.insert(ev.op, at, Op.OOM), np.insert(ev.size, at, 512 * MiB),
                      addr=np.insert(ev.addr, at, 0), rounded=np.insert(ev.rounded, at, 0))
    path = _write(tmp_path, "oom", ev)
    plain, run, done = _both(path, "best-fit", SimConfig())
    assert run is not None and done <= 2500
    _same(plain, run)


def test_a_dropped_row_falls_back_to_the_whole_replay(tmp_path: Path) -> None:
    path = _write(tmp_path, "bad", _program(3, 4000, 0.0, 0.01, False, 1, False))
    trace = read_trace(path)
    assert trace.dropped > 0
    _, run, _ = _both(path, "first-fit", SimConfig())
    assert run is None  # the read dropped rows: the rows differ from what the head start paired


def test_a_trace_the_reader_refuses_gives_its_sentence_and_stops_the_threads(tmp_path: Path) -> None:
    path = _write(tmp_path, "huge", _program(4, 3000, 0.0, 0.0, False, 1, True))
    with pytest.raises(TraceFormatError, match="requests must be below 2\\^60 bytes") as plain:
        read_trace(path)
    model = policies.get("best-fit")
    with pytest.raises(TraceFormatError) as headed, hs.head_start(model, SimConfig()) as head:
        assert head is not None
        read_trace(path, on_window=head.take)
    assert str(headed.value) == str(plain.value) and head._threads == []


def test_a_replay_that_stops_at_its_first_oom_stops_alike(tmp_path: Path) -> None:
    path = _write(tmp_path, "tight", _program(5, 4000, 0.0, 0.0, False, 1, False))
    config = SimConfig(capacity=300 * MiB, continue_on_oom=False)
    plain, run, _ = _both(path, "best-fit", config)
    assert run is not None and plain.stats is not None
    _same(plain, run)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), oom=st.sampled_from([0.0, 0.001, 0.01]),
       bad=st.sampled_from([0.0, 0.0005]), segments=st.booleans(), devices=st.integers(1, 2),
       policy=st.sampled_from(HEAPS),
       capacity=st.sampled_from([None, 200 * MiB, 600 * MiB]), cont=st.booleans(), stop_first=st.booleans())
def test_random_traces_answer_alike_both_ways(tmp_path: Path, seed: int, oom: float, bad: float,
                                               segments: bool, devices: int, policy: str,
                                               capacity: int | None, cont: bool, stop_first: bool) -> None:
    path = _write(tmp_path, f"r{seed}", _program(seed, 2500, oom, bad, segments, devices, False))
    config = SimConfig(capacity=capacity, continue_on_oom=cont, stop_at_first_oom=stop_first)
    plain, run, _ = _both(path, policy, config)
    if run is not None:
        _same(plain, run)
    else:
        assert read_trace(path).dropped > 0  # the only cause of a fallback among these traces
    assert run is not None or bad > 0


def test_replay_file_gives_the_same_result_with_and_without(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, "whole", _program(6, 4000, 0.002, 0.0, True, 2, False))
    on = replay_file(path, "best-fit", SimConfig())
    monkeypatch.setenv(hs.SWITCH, "0")
    off = replay_file(path, "best-fit", SimConfig())
    assert on.summary == off.summary and on.warnings == off.warnings
    _same(on.run, off.run)


def test_a_read_that_fails_stops_the_threads(tmp_path: Path) -> None:
    path = _write(tmp_path, "stop", _program(7, 4000, 0.0, 0.0, False, 1, False))
    model = policies.get("best-fit")
    taken: list[int] = []
    with pytest.raises(RuntimeError), hs.head_start(model, SimConfig()) as head:
        assert head is not None

        def take(w: columns.Window) -> None:
            head.take(w)
            taken.append(w.at)
            if len(taken) == 3:
                raise RuntimeError("the read stops here")

        read_trace(path, on_window=take)
    assert head._threads == []  # joined


def test_off_on_few_cores_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(hs.SWITCH)
    monkeypatch.setattr(hs.os, "sched_getaffinity", lambda pid: {0, 1})
    assert not hs.wanted()
    monkeypatch.setattr(hs.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert hs.wanted()
    monkeypatch.setenv(hs.SWITCH, "0")
    assert not hs.wanted()


def test_a_signal_while_the_answer_waits_stops_the_replay(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal held back while ``finish`` waits for the threads is raised there (as between a
    replay's steps), and the threads are stopped and joined on the way out."""
    path = _write(tmp_path, "signal", _program(8, 4000, 0.0, 0.0, False, 1, False))
    model = policies.get("best-fit")

    def held() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), hs.head_start(model, SimConfig()) as head:
        assert head is not None
        trace = read_trace(path, on_window=head.take)
        monkeypatch.setattr(hs.interrupts, "check", held)
        monkeypatch.setattr(hs, "_STEP", 1)  # a step a row: the threads are still at work when it waits
        head.finish(trace)
    assert head._threads == []


@pytest.mark.parametrize("policy", HEAPS)
@pytest.mark.parametrize("capacity", [None, 300 * MiB])
@pytest.mark.parametrize("cont", [False, True])
def test_a_summary_alone_is_the_same_summary(tmp_path: Path, policy: str, capacity: int | None,
                                             cont: bool) -> None:
    """``SimConfig.per_event`` off (``replay`` without ``-o``): no per-event addresses or roundings,
    the same summary, statuses and stats, with and without the head start."""
    from tracekit.sim.engine import replay

    trace = read_trace(_write(tmp_path, "summary", _program(9, 3000, 0.002, 0.0, True, 1, False)))
    whole = replay(trace, policy, SimConfig(capacity=capacity, continue_on_oom=cont))
    alone = replay(trace, policy, SimConfig(capacity=capacity, continue_on_oom=cont, per_event=False))
    assert alone.summary == whole.summary
    assert np.array_equal(alone.run.status, whole.run.status)
    assert np.array_equal(alone.run.stats, whole.run.stats)
    assert len(alone.run.addr) == 0 and alone.run.rounded is None and len(whole.run.addr) == 3000
