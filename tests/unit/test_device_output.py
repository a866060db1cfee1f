"""The device replay's output trace, JSON summary and comparison, from hand-built runs (no GPU).

A ``DeviceRun`` is plain arrays, so the conversion to a v1 trace and to the
summary is tested here with a run whose every figure is worked out by hand;
the GPU tests check that real replays produce such runs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tracekit.device.allocators import SegmentLog
from tracekit.device.capacity import DRIVER_SLACK, Allocator, CapacityPlan
from tracekit.device.compare import ReservedComparison, compare_summaries, format_comparison
from tracekit.device.figures import DeviceFigures, Latency
from tracekit.device.replay import DeviceConfig, DeviceRun
from tracekit.device.result import EXTRA_FIELDS, live_curve, output_events, summary
from tracekit.sim.result import OOMInfo, ReplaySummary
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

MiB = 1 << 20
M, F, SA, OOM = Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC, Op.OOM


@pytest.fixture
def trace(tmp_path: Path):
    # 0 malloc A 1000 | 1 malloc B 3000 | 2 free A | 3 malloc C 5000 | 4 free B | 5 free C | 6 segment row
    ops = np.array([M, M, F, M, F, F, SA], np.int8)
    size = np.array([1000, 3000, 1024, 5000, 3072, 5120, 2 * MiB], np.uint64)
    addr = np.array([4096, 8192, 4096, 12288, 8192, 12288, 1 << 30], np.uint64)
    p = tmp_path / "in.parquet"
    write_trace(p, TraceMeta.new(Source.SYNTHETIC), Events.build(ops, size, addr=addr,
                                                                   seq=np.arange(10, 17, dtype=np.uint64)))
    # Not strict: the lone segment row holds none of the blocks, which the reader warns about.
    t = read_trace(p)
    assert [w.kind.name for w in t.warnings] == ["BLOCK_OUTSIDE_SEGMENT"] and not t.issues
    return t


def _run(trace, allocator: Allocator = Allocator.CUPY) -> DeviceRun:
    """Request 3 failed (OOM) under --continue-on-oom, so the free of C (5) was skipped."""
    log = SegmentLog()
    log.add(0, SA, 1 << 40, 2 * MiB, 900, 1_000, 100 * MiB)
    log.add(1, SA, (1 << 40) + 4 * MiB, 2 * MiB, 800, 3_000, 98 * MiB)
    log.add(3, Op.SEGMENT_FREE, 1 << 40, 2 * MiB, 700, 6_000, 100 * MiB)
    d = 1 << 40
    return DeviceRun(
        config=DeviceConfig(0, allocator, 4 * MiB, continue_on_oom=True),
        plan=CapacityPlan(4 * MiB, 0, 4 * MiB),
        status=np.array([1, 1, 1, 2, 1, 3, 0], np.int8),
        addr=np.array([d, d + 4 * MiB, d, 0, d + 4 * MiB, 0, 0], np.uint64),
        latency=np.array([2000, 2100, 300, 5000, 310, -1, -1], np.int64),
        t_end=np.array([2_000, 4_000, 5_000, 7_000, 8_000, 0, 0], np.int64),
        device_free=np.array([-1, -1, -1, 96 * MiB, -1, -1, -1], np.int64),
        rows=log, total=140 * 1024 * MiB, free_start=120 * MiB, free_replay=120 * MiB,
        free_end=120 * MiB, peak_reserved=4 * MiB, ooms=1, first_oom=3,
        oom_state={"device_free": 96 * MiB, "error": "Out of memory", "live_bytes": 3072,
                   "reserved_bytes": 2 * MiB, "free_bytes": 2 * MiB - 3072},
    )


def test_rows_in_order_with_allocator_rows_where_they_happened(trace) -> None:
    ev, extras = output_events(trace, _run(trace))
    assert [Op(o).label for o in ev.op] == [
        "segment_alloc", "malloc", "segment_alloc", "malloc", "free", "segment_free", "oom", "free"]
    # frees carry the block's rounded size; the oom row the request; segments their bytes
    assert ev.size.tolist() == [2 * MiB, 1000, 2 * MiB, 3000, 1024, 2 * MiB, 5000, 3072]
    assert ev.rounded[[1, 3, 6]].tolist() == [1024, 3072, 5120]
    assert ev.seq.tolist() == list(range(8))
    assert np.all(np.diff(ev.t_ns) >= 0)
    assert extras["input_seq"].to_pylist() == [None, 10, None, 11, 12, None, 13, 14]
    assert extras["latency_ns"].to_pylist() == [900, 2000, 800, 2100, 300, 700, 5000, 310]
    assert extras["device_free"].to_pylist() == [100 * MiB, None, 98 * MiB, None, None, 100 * MiB,
                                                 96 * MiB, None]


def test_output_is_a_valid_trace_that_pairs(trace, tmp_path: Path) -> None:
    ev, extras = output_events(trace, _run(trace))
    out = tmp_path / "out.parquet"
    write_trace(out, TraceMeta.new(Source.REPLAY), ev, extras, extra_fields=EXTRA_FIELDS)
    back = read_trace(out, strict=True)
    assert len(back.events) == 8 and not back.issues
    assert back.mate[4] == 1 and back.mate[7] == 3  # each free pairs with its real malloc
    assert back.extras is not None and back.extras.column_names == ["latency_ns", "device_free", "input_seq"]


def test_live_curve_and_summary(trace) -> None:
    run = _run(trace)
    assert live_curve(trace, run).tolist() == [1024, 4096, 3072, 3072, 0, 0, 0]
    s = summary(trace, run).to_dict()
    assert s["policy"] == "cupy" and s["peak_live_bytes"] == 4096
    assert s["segment_allocs"] == 2 and s["segment_frees"] == 1
    assert s["oom_count"] == 1 and s["device"]["replayed"] == 6
    assert s["oom"]["seq"] == 13 and s["oom"]["size"] == 5000 and s["oom"]["rounded"] == 5120
    assert s["oom"]["cause"] == "fragmentation"  # the pool held 2 MiB - 3072 B free, more than 5120 B
    assert s["oom"]["largest_free_block"] is None  # no device API reports it
    d = s["device"]
    assert d["malloc_latency_ns"]["count"] == 2 and d["malloc_latency_ns"]["p50"] == 2050
    assert d["free_latency_ns"]["count"] == 2
    assert d["released"] is True and d["peak_reserved"] == "exact"
    text = summary(trace, run).to_text()
    assert "out of memory  at seq 13" in text and "released       yes" in text
    assert "largest free block n/a" in text


def test_cuda_oom_reserved_comes_from_device_free(trace) -> None:
    run = _run(trace, Allocator.CUDA)
    run = DeviceRun(**{**run.__dict__, "oom_state": {"device_free": 96 * MiB, "error": "oom"}})
    s = summary(trace, run).to_dict()
    assert s["oom"]["free_bytes"] == 96 * MiB - DRIVER_SLACK  # the driver never hands out its slack
    assert s["device"]["oom"] == {"device_free": 96 * MiB, "error": "oom"}
    assert s["oom"]["reserved_bytes"] == 24 * MiB  # 120 MiB at the start - 96 MiB left
    assert s["oom"]["live_bytes"] == 3072
    assert s["device"]["peak_reserved"] == "sampled"


def _summary(policy: str, oom_seq: int | None, peak_reserved: int, segment_allocs: int,
             device: DeviceFigures | None = None) -> ReplaySummary:
    oom = None if oom_seq is None else OOMInfo(oom_seq, 5000, 5120, 0, None, 3072, peak_reserved)
    s = ReplaySummary(policy, 4 * MiB, None, 7, 4096, peak_reserved, None, segment_allocs, 1, oom, 1, True)
    return s if device is None else s.with_figures(device)


def _device(allocator: str, peak_reserved: str) -> DeviceFigures:
    lat = Latency(2000.0, 2100.0, 2)
    return DeviceFigures(0, allocator, 6, peak_reserved, lat, lat, 140 * 1024 * MiB, 120 * MiB, 120 * MiB,
                         120 * MiB, 0)


def test_compare_agrees_and_disagrees() -> None:
    dev = _summary("cupy", 13, 4 * MiB, 2, _device("cupy", "exact"))
    sim = _summary("cupy", 13, 4 * MiB, 2)
    c = compare_summaries(dev, sim, "cupy")
    assert c.agree is True and c.allocator == "cupy"
    assert [(r.figure, r.device, r.sim) for r in c.rows] == [
        ("first_oom_seq", 13, 13), ("peak_reserved_bytes", 4 * MiB, 4 * MiB), ("segment_allocs", 2, 2),
        ("segment_frees", 1, 1), ("peak_live_bytes", 4096, 4096)]
    c = compare_summaries(dev, _summary("cupy", 13, 4 * MiB, 3), "cupy")
    assert c.agree is False
    assert "DISAGREE" in format_comparison(c)
    assert compare_summaries(dev, _summary("cupy", None, 4 * MiB, 2), "cupy").agree is False  # no OOM there
    # the cuda allocator's peak reserved is sampled: shown, but it does not decide
    cuda = _summary("cuda", 13, 4 * MiB, 2, _device("cuda", "sampled"))
    c = compare_summaries(cuda, _summary("first-fit", 13, 1, 2), "first-fit")
    assert c.agree is True
    assert next(r for r in c.rows if r.figure == "peak_reserved_bytes").agree is None


def test_reserved_bytes_decide_the_verdict_and_keep_their_json() -> None:
    dev = _summary("torch", 13, 4 * MiB, 2, _device("torch", "exact"))
    c = compare_summaries(dev, _summary("torch", 13, 4 * MiB, 2), "torch")
    same = ReservedComparison("model, recorded addresses", 5, 5, None, None, None, None)
    off = ReservedComparison("model, this device's addresses", 5, 3, 2, 12, 2 * MiB, 4 * MiB)
    assert replace(c, reserved=(same,)).agree is True and replace(c, reserved=(same, off)).agree is False
    d = replace(c, reserved=(same, off)).to_dict()
    assert list(d) == ["policy", "allocator", "rows", "agree", "reserved"] and d["agree"] is False
    assert d["reserved"][1] == {"model": "model, this device's addresses", "requests": 5, "same": 3,
                                "first_index": 2, "first_seq": 12, "device_reserved": 2 * MiB,
                                "model_reserved": 4 * MiB}
    assert "reserved" not in c.to_dict()
    assert "first differ at seq 12 (input row 2)" in format_comparison(replace(c, reserved=(off,)))


class _Runtime:
    """A stand-in for cupy.cuda.runtime that fails one cudaFree and the synchronize."""

    def __init__(self, bad: int) -> None:
        self.bad = bad
        self.freed: list[int] = []

    def free(self, p: int) -> None:
        if p == self.bad:
            raise RuntimeError("cudaErrorInvalidValue")
        self.freed.append(p)

    def deviceSynchronize(self) -> None:
        raise RuntimeError("cudaErrorLaunchFailure")


class _Ballast:
    released = False

    def release(self) -> None:
        self.released = True


def test_cleanup_frees_every_block_and_the_ballast_when_one_free_fails() -> None:
    from tracekit.device.loops import Loop
    from tracekit.device.replay import release_all
    from tracekit.interrupts import Held

    lp = Loop(4, False, None, Held())
    lp.live.update({0: 0x1000, 1: 0x2000, 2: 0x3000})
    rt, ballast = _Runtime(bad=0x1000), _Ballast()
    errors = release_all(rt, lp, None, ballast)
    assert rt.freed == [0x2000, 0x3000] and ballast.released and not lp.live
    assert errors == ["cudaFree(0x1000): cudaErrorInvalidValue",
                      "cudaDeviceSynchronize: cudaErrorLaunchFailure"]


def test_a_failed_cuda_free_is_a_device_error_naming_the_event() -> None:
    from tracekit.device.loops import Loop, loop_cuda
    from tracekit.errors import DeviceError
    from tracekit.interrupts import Held

    class Runtime:
        class CUDARuntimeError(Exception):
            status = 700  # cudaErrorIllegalAddress, not an out-of-memory

        def malloc(self, size: int) -> int:
            return 0x1000

        def free(self, p: int) -> None:
            raise self.CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access")

        def memGetInfo(self) -> tuple[int, int]:
            return (1 << 30, 1 << 30)

    ops = np.array([Op.MALLOC, Op.FREE], np.int64)
    lp = Loop(2, False, None, Held())
    with pytest.raises(DeviceError, match=r"CUDA error at event 1 \(cudaFree\): cudaErrorIllegalAddress"):
        loop_cuda(lp, ops, np.array([512, 512], np.int64), np.array([1, 0], np.int64), rt=Runtime())
    assert lp.addr[0] == 0x1000 and lp.status[0] == 1


def test_cuda_oom_within_the_driver_slack_is_exhaustion(trace) -> None:
    """For cuda the driver's slack is not usable: free bytes within it mean the device is full."""
    run = _run(trace, Allocator.CUDA)
    near = DRIVER_SLACK + 4096  # free figure just above the slack: 4 KiB usable < 5120 B rounded
    run = DeviceRun(**{**run.__dict__, "oom_state": {"device_free": near, "error": "oom"}})
    assert summary(trace, run).to_dict()["oom"]["cause"] == "exhausted"
    roomy = DeviceRun(**{**run.__dict__, "oom_state": {"device_free": DRIVER_SLACK + 8192, "error": "oom"}})
    assert summary(trace, roomy).to_dict()["oom"]["cause"] == "fragmentation"
    pool = DeviceRun(**{**_run(trace).__dict__, "oom_state": {"free_bytes": 8192, "device_free": 8192}})
    # a pool's free bytes count whole
    assert summary(trace, pool).to_dict()["oom"]["cause"] == "fragmentation"


def test_the_output_trace_names_what_was_replayed_where(trace, tmp_path: Path) -> None:
    from tracekit.device.command import ReplayMetaDict, write_output
    from tracekit.trace.reader import read_meta

    out = write_output(trace, _run(trace), tmp_path / "out.parquet")
    replay = read_meta(out).extra["replay"]
    assert replay == {"kind": "device", "device_index": 0, "allocator": "cupy", "capacity": 4 * MiB,
                      "ballast_bytes": 0, "free_at_start": 120 * MiB, "input": str(trace.path)}
    assert list(replay) == list(ReplayMetaDict.__annotations__)  # the shape, key for key
