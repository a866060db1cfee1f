"""The replay engine: registry, summary, the written replay trace, options and progress."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_freelist import SIZES, make_trace, steps_strategy

from tracekit import progress
from tracekit.advise.replay import replay_file
from tracekit.errors import OutputError, UsageError
from tracekit.sim import policies
from tracekit.sim.base import PolicyRun, SimConfig, Stat, Status
from tracekit.sim.engine import fits, replay, write_replay
from tracekit.sim.options import parse_alloc_conf
from tracekit.sim.output import replay_events
from tracekit.sim.prepare import prepare
from tracekit.trace import Events, Op, Source, Trace, TraceMeta, read_trace, write_trace

SUMMARY_KEYS = {
    "policy", "capacity", "device_total", "events", "peak_live_bytes", "peak_reserved_bytes",
    "peak_extent", "segment_allocs", "segment_frees", "oom", "oom_count", "handled_oom_count",
}
OOM_KEYS = {"seq", "size", "rounded", "free_bytes", "largest_free_block", "live_bytes",
            "reserved_bytes", "cause"}


def test_registry_finds_every_policy_module() -> None:
    table = policies.models()
    assert {"first-fit", "best-fit", "next-fit", "worst-fit", "buddy"} <= set(table)
    for name, model in table.items():
        assert model.name == name and model.description


def test_unknown_policy_lists_the_valid_names() -> None:
    with pytest.raises(UsageError) as e:
        policies.get("bestfit")
    assert "bestfit" in str(e.value)
    for name in ("first-fit", "best-fit", "buddy"):
        assert name in str(e.value)


def _recorded(tmp_path: Path) -> Path:
    """A recorded-looking trace: t_ns, sites, an input segment row and a boolean extra column.

    idx op            size  t_ns  initial
    0   segment_alloc 8192  5     True    (ignored by the replay)
    1   malloc        1000  10    True
    2   malloc        6000  20    False   (6144 B: fits in 8 KiB after #1)
    3   malloc        2000  30    False   (2048 B: OOM, only 1024 B left)
    4   free #2             40    False
    5   free #3             50    False   (skipped: #3 failed)
    6   malloc         512  60    False   (first fit: 1024, right after #1)
    """
    op = np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE, Op.MALLOC],
                  np.int8)
    size = np.array([8192, 1000, 6000, 2000, 6144, 2048, 512], np.uint64)
    addr = np.array([0x100, 0x100, 0x600, 0x2000, 0x600, 0x2000, 0x3000], np.uint64)
    ev = Events.build(op, size, addr=addr, t_ns=np.array([5, 10, 20, 30, 40, 50, 60]),
                      site=np.array([-1, 0, 1, 1, -1, -1, 0]), sites=("a.py:1:f", "b.py:2:g"))
    path = tmp_path / "in.parquet"
    initial = np.array([True, True, False, False, False, False, False])
    write_trace(path, TraceMeta.new(Source.TORCH), ev, {"initial": initial})
    return path


def test_written_replay_rows(tmp_path: Path) -> None:
    trace = read_trace(_recorded(tmp_path))
    res = replay(trace, "first-fit", SimConfig(capacity=8192, continue_on_oom=True))
    out = write_replay(res, trace, tmp_path / "out.parquet", command="tracekit replay")
    back = read_trace(out)
    ev = back.events
    assert back.meta.source == Source.REPLAY
    assert back.meta.extra["policy"] == "first-fit" and back.meta.extra["capacity"] == 8192
    assert back.meta.pool_limit_bytes == 8192 and back.meta.command == "tracekit replay"
    assert [Op(o).label for o in ev.op] == ["segment_alloc", "malloc", "malloc", "oom", "free", "malloc"]
    assert ev.seq.tolist() == list(range(6))
    assert ev.t_ns.tolist() == [5, 10, 20, 30, 40, 60]  # the segment row takes #0's time
    assert ev.addr.tolist() == [0, 0, 1024, 0, 1024, 1024]
    assert ev.size.tolist() == [8192, 1000, 6000, 2000, 6144, 512]
    assert ev.rounded.tolist() == [0, 1024, 6144, 2048, 0, 512]
    assert [ev.site_name(i) for i in range(6)] == [None, "a.py:1:f", "b.py:2:g", "b.py:2:g", None,
                                                   "a.py:1:f"]
    assert back.extras is not None
    # The heap segment is created to hold the initial block, so it is part of the initial state.
    assert back.extras.column("initial").to_pylist() == [True, True, False, False, False, False]
    assert back.mate.tolist()[1:3] == [-1, 4]


def test_stopping_replay_ends_with_the_oom_row(tmp_path: Path) -> None:
    trace = read_trace(_recorded(tmp_path))
    res = replay(trace, "best-fit", SimConfig(capacity=8192))
    out, _ = replay_events(res.run, trace)
    assert [Op(o).label for o in out.op] == ["segment_alloc", "malloc", "malloc", "oom"]
    d = res.to_dict()
    assert set(d) == SUMMARY_KEYS and set(d["oom"]) == OOM_KEYS
    assert d["oom"]["seq"] == 3 and d["oom"]["size"] == 2000 and d["oom"]["rounded"] == 2048
    assert d["oom"]["cause"] == "exhausted" and d["oom_count"] == 1
    assert "stopped" in res.to_text()


def test_policy_rows_are_inserted_before_their_event() -> None:
    # A hand-made run: rows before input 0, two before input 2, one at the end.
    trace = make_trace([("m", 512), ("m", 512), ("f", 0), ("f", 1)])
    n = len(trace.events)
    run = PolicyRun(
        addr=np.array([0, 512, 0, 0], np.uint64),
        status=np.full(n, Status.DONE, np.int8),
        rows_before=np.array([0, 2, 2, n]),
        rows_op=np.array([Op.SEGMENT_ALLOC, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.SEGMENT_FREE], np.int8),
        rows_addr=np.array([0, 4096, 4096, 0], np.uint64),
        rows_size=np.array([1024, 512, 512, 1024], np.uint64),
        rows_stream=np.array([0, 7, 7, 0], np.uint64),
        stats=np.zeros(len(Stat), np.int64),
    )
    out, src = replay_events(run, trace)
    assert [Op(o).label for o in out.op] == [
        "segment_alloc", "malloc", "malloc", "segment_alloc", "segment_free", "free", "free", "segment_free"]
    assert src.tolist() == [-1, 0, 1, -1, -1, 2, 3, -1]
    assert out.t_ns.tolist() == [0, 0, 1, 2, 2, 2, 3, 3]
    assert out.stream.tolist() == [0, 0, 0, 7, 7, 0, 0, 0]
    assert out.addr.tolist() == [0, 0, 512, 4096, 4096, 0, 512, 0]


def test_refuses_to_overwrite_the_input(tmp_path: Path) -> None:
    src = _recorded(tmp_path)
    trace = read_trace(src)
    res = replay(trace, "first-fit", SimConfig())
    with pytest.raises(OutputError, match="input"):
        write_replay(res, trace, src)
    with pytest.raises(OutputError):
        replay_file(src, "first-fit", SimConfig(), output=src)


def test_replay_file_checks_the_policy_before_reading(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        replay_file(tmp_path / "missing.parquet", "nope", SimConfig())


def test_fits_and_prepare_cache() -> None:
    trace = make_trace([("m", 4096), ("m", 4096), ("f", 0), ("m", 8192)])
    assert prepare(trace) is prepare(trace)
    assert fits(trace, "first-fit", SimConfig(capacity=16384))
    assert not fits(trace, "first-fit", SimConfig(capacity=12288))  # hole of 4 KiB + tail 4 KiB
    assert fits(trace, "first-fit", SimConfig(capacity=None))


def test_summary_text_names_fragmentation() -> None:
    trace = make_trace([("m", 1024)] * 4 + [("f", 0), ("f", 2), ("m", 2048)])
    text = replay(trace, "best-fit", SimConfig(capacity=4096)).to_text()
    assert "fragmentation" in text and "seq 6" in text


@pytest.mark.parametrize("text,expected", [
    ("expandable_segments:True", {"expandable_segments": "True"}),
    ("expandable_segments:True,max_split_size_mb:256",
     {"expandable_segments": "True", "max_split_size_mb": "256"}),
    ("roundup_power2_divisions:[256:1,512:2,>:8], garbage_collection_threshold:0.6",
     {"roundup_power2_divisions": "[256:1,512:2,>:8]", "garbage_collection_threshold": "0.6"}),
])
def test_parse_alloc_conf(text: str, expected: dict) -> None:
    assert parse_alloc_conf(text) == expected


@pytest.mark.parametrize("text", ["expandable_segments", "a:1,a:2", "x:[1,2", ":3", "x:1]"])
def test_parse_alloc_conf_rejects(text: str) -> None:
    with pytest.raises(UsageError):
        parse_alloc_conf(text)


def test_progress_is_reported_per_chunk(monkeypatch) -> None:
    monkeypatch.setattr(progress, "CHUNK", 3)
    trace = make_trace([("m", 1)] * 7)
    seen: list[tuple[int, int]] = []
    with progress.reporting(lambda done, total: seen.append((done, total))):
        replay(trace, "best-fit", SimConfig())
    assert seen == [(3, 7), (6, 7), (7, 7)]



def test_warnings_for_skipped_events_and_several_devices(tmp_path: Path) -> None:
    # A free of an address never allocated is skipped by the reader; two devices share one heap.
    op = np.array([Op.MALLOC, Op.FREE, Op.MALLOC], np.int8)
    ev = Events.build(op, np.array([512, 512, 512], np.uint64), addr=np.array([1, 2, 3], np.uint64),
                      device=np.array([0, 0, 1]))
    path = tmp_path / "t.parquet"
    write_trace(path, TraceMeta.new(Source.CUPY), ev)
    res = replay_file(path, "first-fit", SimConfig())
    assert len(res.warnings) == 2
    assert res.warnings[0].startswith("skipped 1 x free of an address that is not live")
    assert "several devices" in res.warnings[1]


@pytest.mark.parametrize("policy", ["first-fit", "best-fit", "next-fit", "worst-fit", "buddy"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps_strategy(SIZES, max_len=40), cap=st.sampled_from([None, 4096, 8192]), cont=st.booleans())
def test_written_replay_reads_back_strictly(tmp_path: Path, policy: str, steps, cap, cont) -> None:
    # The simulated addresses must pair every free with its malloc again (the reader's --strict).
    trace = make_trace(steps)
    res = replay(trace, policy, SimConfig(capacity=cap, continue_on_oom=cont))
    back = read_trace(write_replay(res, trace, tmp_path / f"{policy}.parquet"), strict=True)
    ev = back.events
    assert ev.count(Op.OOM) == res.summary.oom_count + res.summary.handled_ooms  # handled ones too
    assert ev.count(Op.MALLOC) == int(np.count_nonzero(
        (res.run.status == Status.DONE) & (trace.events.op != Op.FREE)))
    frees = np.flatnonzero(ev.op == Op.FREE)
    assert np.all(back.mate[frees] >= 0)
    assert np.array_equal(ev.size[frees], ev.rounded[back.mate[frees]])


def test_heap_peak_reserved_is_labelled_as_the_high_water_mark(tmp_path: Path) -> None:
    # Unbounded first fit over 1000 B + 6000 B: high-water mark 1024 + 6144 = 7168 B; the heap
    # segment written for the analyzer is that rounded up to 2 MiB, so the label must say which.
    trace = read_trace(_recorded(tmp_path))
    heap = replay(trace, "first-fit")
    assert heap.summary.peak_reserved_bytes == heap.summary.peak_extent
    assert "peak reserved  " in heap.to_text() and "(heap high-water mark)" in heap.to_text()
    assert "high-water" not in replay(trace, "cupy").to_text()


def test_a_replay_adds_its_own_figures_to_the_one_summary() -> None:
    """A device replay reports the common figures plus its own group (here a stand-in group)."""
    from dataclasses import dataclass
    from typing import Any

    @dataclass(frozen=True)
    class Latency:
        p50_ns: int
        key: str = "device"

        def to_dict(self) -> dict[str, Any]:
            return {"p50_ns": self.p50_ns}

        def to_lines(self) -> list[str]:
            return [f"latency p50   {self.p50_ns} ns"]

    op = np.array([Op.MALLOC, Op.FREE], np.int8)
    trace = Trace(None, TraceMeta.new(Source.SYNTHETIC), Events.build(op, np.array([1000, 0], np.uint64),
                  addr=np.array([64, 64], np.uint64)), np.array([-1, 0], np.int64), None, ())
    base = replay(trace, "best-fit").summary
    both = base.with_figures(Latency(1500))
    assert both.to_dict() == {**base.to_dict(), "device": {"p50_ns": 1500}}
    assert both.to_text() == base.to_text() + "\nlatency p50   1500 ns"
    assert base.peak_live_bytes == 1024 and base.oom is None
