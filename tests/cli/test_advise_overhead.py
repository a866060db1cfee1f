"""``advise`` when the device ran out: the room, the overhead cures, the smallest set that fits.

Worked example (MiB unless noted; a device of 1,024 MiB with 2 SMs x 1,024 threads = 2,048
threads): at start 1,000 MiB are free and the stack limit is 1,024 B per thread. The CuPy pool
takes a 100 MiB and a 200 MiB segment (one block each), then a 300 MiB request fails with
50 MiB free on the device (measured), the stack limit grown to 66,560 B and process 4242
holding ``other`` MiB. So:

- room R = 50 free + 300 reserved = 350; the pool needs 100 + 200 + 300 = 600 through the
  failing request (a fresh 300 MiB segment); 250 are missing;
- the stack limit gives back (66,560 − 1,024) B x 2,048 = 128 MiB (estimated: the only
  measured fall, start to OOM, also holds the other process);
- the other process gives back ``other`` (measured, NVML).

other = 400: the process alone covers 250 (the stack alone does not), so the pick is the
process, replayed at 350 + 400 = 750. other = 200: neither alone; both give 328 ≥ 250, the
pick is the pair, replayed at 678. other = 50: 178 < 250, 72 MiB short.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.advise.candidates import Kind
from tracekit.advise.run import advise
from tracekit.cli.app import app
from tracekit.trace import Events, Op, Source, Trace, TraceMeta, read_trace, write_trace
from tracekit.trace.schema import DeviceInfo
from tracekit.trace.validate import pair_events

MIB = 1 << 20
TRACES = Path(__file__).resolve().parents[2] / "traces"
THREADS = 2 * 1024
STACK0, STACK1 = 1024, 66_560
SA, M, OO = Op.SEGMENT_ALLOC, Op.MALLOC, Op.OOM


def v2_trace(other_mib: int, *, heap_mib: tuple[int, int] = (8, 8), pool_limit: int | None = None,
             unrecorded_mib: int = 0) -> Trace:
    """The worked example; ``heap_mib``: the malloc heap limit at start and at the OOM;
    ``unrecorded_mib``: memory this process holds outside its pool and the limits (NVML's
    count for it is 300 pool + 24 context + 128 stack growth + this + the heap's growth)."""
    rows = [(SA, 100, 0x1000), (M, 100, 0x1000), (SA, 200, 0x9000), (M, 200, 0x9000), (OO, 300, 0)]
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] * MIB for r in rows], np.uint64)
    ev = Events.build(op, size, addr=np.array([r[2] * MIB for r in rows], np.uint64),
                      rounded=np.where(op == SA, 0, size).astype(np.uint64),
                      site=np.array([-1, 0, -1, 0, 0], np.int32), sites=("train.py:9:step",))
    limits0 = {"stack_size": STACK0, "malloc_heap_size": heap_mib[0] * MIB, "printf_fifo_size": MIB}
    limits1 = dict(limits0, stack_size=STACK1, malloc_heap_size=heap_mib[1] * MIB)
    budget = {"cuda_total": 1024 * MIB, "cuda_free": 1000 * MIB, "context_bytes": 24 * MIB,
              "other_processes": [], "other_processes_bytes": 0, "sm_count": 2, "max_threads_per_sm": 1024,
              **limits0}
    state = {"seq": 4, "device": 0, "mem_free": 50 * MIB, "mem_total": 1024 * MIB, "limits": limits1,
             "processes": [{"pid": 77, "name": "python", "self": True,
                            "used_bytes": (452 + unrecorded_mib + heap_mib[1] - heap_mib[0]) * MIB},
                           {"pid": 4242, "name": "trainer", "used_bytes": other_mib * MIB, "self": False}],
             "pool": {"used_bytes": 300 * MIB, "total_bytes": 300 * MIB, "limit_bytes": pool_limit or 0}}
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("GPU", 1024 * MIB, 1000 * MIB),
                         pool_limit_bytes=pool_limit).with_extra(
        budget=budget, oom_states=[state], exit={"status": "exception", "oom_seq": 4,
                                                 "exception": "OutOfMemoryError"})
    return Trace(None, meta, ev, pair_events(ev.op, ev.addr, ev.device, ev.seq).mate, None, ())


def cure(result: Any, kind: Kind) -> Any:
    return next(o for o in result.room.tried if o.candidate.kind == kind)


def test_room_and_the_single_cure_that_fits():
    r = advise(v2_trace(400), jobs=1)
    ra = r.room
    assert ra is not None and r.limit == 350 * MIB  # the room, not the device's 1,024 MiB
    assert (ra.room.free, ra.room.reserved, ra.room.need, ra.room.missing) == (50 * MIB, 300 * MIB, 600 * MIB,
                                                                                250 * MIB)
    stack = cure(r, Kind.STACK_LIMIT)
    (c,) = stack.candidate.cures
    assert c.returns == (STACK1 - STACK0) * THREADS == 128 * MIB and c.how.value == "estimated"
    assert "deviceSetLimit(cupy.cuda.runtime.cudaLimitStackSize, 1024)" in c.action
    assert not stack.fits and stack.capacity == 478 * MIB
    proc = cure(r, Kind.OTHER_PROCESS)
    (p,) = proc.candidate.cures
    assert (p.returns, p.how.value, p.own) == (400 * MIB, "measured", False)
    assert "process 4242 (trainer)" in p.action and "CUDA_VISIBLE_DEVICES" in p.action
    assert proc.fits and proc.capacity == 750 * MIB and proc.peak_reserved == 600 * MIB
    assert ra.pick is proc and r.fits[0] is proc
    text = r.recommendation()
    assert text.startswith("The device ran out, not a pool limit") and "250.00 MiB more" in text
    assert "stop process 4242 (trainer)" in text
    # No raised set_limit: a pool limit cannot create device memory.
    assert not any(o.candidate.kind == Kind.CUPY_LIMIT for o in r.tried)


def test_two_cures_together():
    r = advise(v2_trace(200), jobs=1)
    pick = r.room.pick
    assert pick is not None and pick.candidate.kind == Kind.CURES
    assert {c.kind for c in pick.candidate.cures} == {Kind.STACK_LIMIT, Kind.OTHER_PROCESS}
    assert pick.capacity == (350 + 128 + 200) * MIB and pick.fits
    assert not cure(r, Kind.STACK_LIMIT).fits and not cure(r, Kind.OTHER_PROCESS).fits
    assert "Cures: lower the stack limit" in r.recommendation()


def test_memory_outside_the_recorded_pools():
    """100 MiB more in this process's NVML count than its pool, context and limits explain:
    a cure whose holder is not named, preferred last among sets of one size."""
    r = advise(v2_trace(50, unrecorded_mib=100), jobs=1)
    rest = cure(r, Kind.OTHER_POOL)
    (c,) = rest.candidate.cures
    assert (c.returns, c.how.value, c.named) == (100 * MIB, "derived", False)
    assert "torch.cuda.empty_cache()" in c.action
    pick = r.room.pick  # 128 + 50 + 100 = 278 >= 250: all three
    assert pick is not None and len(pick.candidate.cures) == 3 and pick.fits


def test_every_cure_falls_short_by_what_is_missing():
    r = advise(v2_trace(50), jobs=1)
    assert r.room.pick is None and not r.fits
    assert r.room.missing_after_all == 72 * MIB
    assert "178.00 MiB, 72.00 MiB short" in r.recommendation()
    assert r.as_json()["missing_bytes"] == 72 * MIB


def test_grown_heap_is_a_cure_set_before_the_kernel():
    r = advise(v2_trace(0, heap_mib=(8, 264)), jobs=1)
    heap = cure(r, Kind.MALLOC_HEAP)
    (c,) = heap.candidate.cures
    assert c.returns == 256 * MIB and c.how.value == "estimated"
    assert "cudaLimitMallocHeapSize, 8388608" in c.action and "cudaErrorInvalidValue" in c.when
    assert heap.fits  # 350 + 256 = 606 >= 600
    assert r.room.pick is heap  # one cure; the stack's 128 MiB would not do


def test_a_stack_limit_without_the_thread_count_is_a_note():
    """A recording without the start budget (``record --torch``) cannot size the stack cure."""
    t = v2_trace(400)
    budget = {k: v for k, v in t.meta.extra["budget"].items() if k != "sm_count"}
    r = advise(dataclasses.replace(t, meta=t.meta.with_extra(budget=budget)), jobs=1)
    assert not any(o.candidate.kind == Kind.STACK_LIMIT for o in r.room.tried)
    assert any("66,560 - 1,024) B x SMs x max threads per SM" in n for n in r.notes)


def test_a_binding_pool_limit_keeps_the_pool_settings():
    """The request went over the pool's 500 MiB limit: a limit OOM, answered by pool settings."""
    r = advise(v2_trace(400, pool_limit=500 * MIB), jobs=1)
    assert r.room is None and r.limit == 500 * MIB


def test_an_explicit_limit_is_the_users_question():
    r = advise(v2_trace(400), limit=700 * MIB, jobs=1)
    assert r.room is None and r.limit == 700 * MIB and r.fits
    assert any("asked instead of the room" in n and "350.00 MiB" in n for n in r.notes)


def test_limit_zero_is_refused():
    from tracekit.errors import UsageError

    with pytest.raises(UsageError, match="positive"):
        advise(v2_trace(400), limit=0, jobs=1)


def advise_cli(tmp_path: Path, t: Trace, *args: str) -> tuple[Path, Any]:
    """``t`` written to a file and advised through the CLI; (the file, the output: JSON where asked)."""
    path = tmp_path / "t.parquet"
    write_trace(path, t.meta, t.events, None)
    res = CliRunner().invoke(app, ["advise", str(path), "--jobs", "1", *args])
    assert res.exit_code == 0, res.output
    return path, json.loads(res.output) if "--json" in args else res.output


def test_cli_json_keys(tmp_path):
    path, d = advise_cli(tmp_path, v2_trace(400), "--json")
    assert d["limit_bytes"] == 350 * MIB and d["limit_is"] == "room" and d["device"] == 0
    assert d["room"] == {"device": 0, "seq": 4, "free_bytes": 50 * MIB, "reserved_bytes": 300 * MIB,
                         "reserved_how": "measured", "room_bytes": 350 * MIB, "need_bytes": 600 * MIB,
                         "missing_bytes": 250 * MIB}
    assert [c["kind"] for c in d["cures"]] == ["other-process", "stack-limit"]
    assert d["fits"][0]["kind"] == "other-process" and d["fits"][0]["returns_bytes"] == 400 * MIB
    assert d["fits"][0]["cures"][0]["how"] == "measured" and d["missing_bytes"] == 0
    kinds = {o["kind"] for o in d["tried"]}
    assert {"cupy-pool", "stack-limit", "other-process"} <= kinds
    assert d["devices"] == []
    bad = CliRunner().invoke(app, ["advise", str(path), "--limit", "0"])
    assert bad.exit_code == 2 and "positive" in bad.output


def test_verify_on_device_with_nothing_to_verify_says_so(tmp_path):
    _, out = advise_cli(tmp_path, v2_trace(50), "--verify-on-device", "0")
    assert "nothing to verify" in out


# The seed scenario, recorded on an H200 and rerun with each cure (traces/seed-cures.json).

@pytest.fixture(scope="module")
def measured() -> dict[str, Any]:
    return json.loads((TRACES / "seed-cures.json").read_text())


@pytest.mark.parametrize("trace", ["cupy-seed.parquet", "cupy-seed-base.parquet"])
def test_seed_trace_room_and_cures(trace):
    r = advise(read_trace(TRACES / trace), jobs=1)
    assert r.room is not None and r.limit == 123_273_216 + 2_164_260_864  # not the 139.80 GiB total
    stack = cure(r, Kind.STACK_LIMIT)
    assert stack.candidate.returns == 4_152_360_960 and stack.candidate.cures[0].how.value == "measured"
    assert stack.fits and cure(r, Kind.OTHER_PROCESS).fits
    assert r.room.pick is stack  # one cure, of this process
    assert "cudaLimitStackSize, 1024" in r.recommendation()


def test_seed_cures_match_the_device(measured):
    """Each cure's bytes within 5 % of what the device gave back when it was applied, and the
    verdict (fits through the failing request) equal to the rerun's."""
    base = advise(read_trace(TRACES / "cupy-seed-base.parquet"), jobs=1)
    heap = advise(read_trace(TRACES / "cupy-seed-heap.parquet"), jobs=1)
    real = {
        Kind.STACK_LIMIT: (base, measured["stack"]["cure"]["returned"], measured["stack"]["arrays"],
                           measured["base"]["arrays"]),
        Kind.OTHER_PROCESS: (base, measured["other"]["cure"]["returned"], measured["other"]["arrays"],
                             measured["base"]["arrays"]),
        Kind.MALLOC_HEAP: (heap, measured["heap"]["heap"]["launch_took"]
                           - measured["heapcure"]["heap"]["launch_took"],
                           measured["heapcure"]["arrays"], measured["heap"]["arrays"]),
    }
    for kind, (r, gave_back, arrays, failed_after) in real.items():
        o = cure(r, kind)
        got = o.candidate.returns
        assert abs(got - gave_back) <= 0.05 * gave_back, (kind, got, gave_back)
        assert o.fits == (arrays > failed_after), kind  # the rerun got past the request that failed


def two_devices(oom_mib: int | None) -> Trace:
    """100 MiB live on each of two 150 MiB devices; ``oom_mib``: a failing request on device 1."""
    rows = [(SA, 100, 0x1000, 0), (SA, 100, 0x1000, 1), (M, 100, 0x1000, 0), (M, 100, 0x1000, 1)]
    if oom_mib is not None:
        rows.append((OO, oom_mib, 0, 1))
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] * MIB for r in rows], np.uint64)
    ev = Events.build(op, size, addr=np.array([r[2] * MIB for r in rows], np.uint64),
                      rounded=np.where(op == SA, 0, size).astype(np.uint64),
                      device=np.array([r[3] for r in rows], np.int32))
    meta = TraceMeta.new(Source.CUPY, device=DeviceInfo("GPU", 150 * MIB, 150 * MIB))
    return Trace(None, meta, ev, pair_events(ev.op, ev.addr, ev.device, ev.seq).mate, None, ())


def test_devices_are_advised_one_at_a_time():
    """Together they hold 200 MiB, more than one device: each alone fits its own 150 MiB."""
    r = advise(two_devices(None), jobs=1)
    assert [d.device for d in r.devices] == [0, 1] and r.device == 0
    for d in r.devices:
        pool = next(o for o in d.tried if o.candidate.kind == Kind.CUPY_POOL)
        assert d.limit == 150 * MIB and pool.fits and pool.peak_reserved == 100 * MIB
        assert d.lower_bound == 100 * MIB
    assert "fits under the limit of 150.00 MiB" in r.recommendation()
    text = r.to_text()
    assert "== device 0" in text and "== device 1" in text and "never added together" in text


def test_the_device_that_ran_out_answers_first(tmp_path):
    _, d = advise_cli(tmp_path, two_devices(60), "--json")
    assert d["device"] == 1 and d["failing_seq"] == 4 and [x["device"] for x in d["devices"]] == [0, 1]
    assert d["devices"][0]["failing_seq"] is None and d["devices"][0]["fits"]
    assert d["lower_bound_bytes"] == 160 * MIB  # device 1's own: 100 live + the 60 MiB request


def test_another_pool_with_cached_blocks():
    """Pool 1 holds a 64 MiB segment with one 16 MiB block live: its free_all_blocks() gives back 48 MiB."""
    import pyarrow as pa

    t = v2_trace(400)
    extra = [(SA, 64, 0x40000), (M, 16, 0x40000)]
    op = np.r_[np.array([r[0] for r in extra], np.int8), t.events.op]
    size = np.r_[np.array([r[1] * MIB for r in extra], np.uint64), t.events.size]
    addr = np.r_[np.array([r[2] * MIB for r in extra], np.uint64), t.events.addr]
    ev = Events.build(op, size, addr=addr, rounded=np.where(op == SA, 0, size).astype(np.uint64),
                      site=np.r_[np.array([-1, 0], np.int32), t.events.site], sites=t.events.sites)
    meta = t.meta.with_extra(oom_states=[dict(t.meta.extra["oom_states"][0], seq=6)],
                             exit=dict(t.meta.extra["exit"], oom_seq=6))
    pools = pa.table({"pool": pa.array([1, 1, 0, 0, 0, 0, 0], pa.uint16())})
    two = Trace(None, meta, ev, pair_events(ev.op, ev.addr, ev.device, ev.seq).mate, pools, ())
    r = advise(two, jobs=1)
    assert r.room is not None and r.room.room.reserved == 364 * MIB  # both pools' segments
    o = cure(r, Kind.OTHER_POOL)
    (c,) = o.candidate.cures
    assert (c.returns, c.how.value, c.named) == (48 * MIB, "derived", True)
    assert "free_all_blocks() on pool 1" in c.action


def test_cli_on_the_seed_trace():
    res = CliRunner().invoke(app, ["advise", str(TRACES / "cupy-seed.parquet"), "--json", "--jobs", "1"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["limit_bytes"] == 2_287_534_080 and d["limit_is"] == "room"  # not 150,109,880,320
    assert d["fits"][0]["kind"] == "stack-limit" and d["fits"][0]["returns_bytes"] == 4_152_360_960
    line = "cupy.cuda.runtime.deviceSetLimit(cupy.cuda.runtime.cudaLimitStackSize, 1024)"
    assert d["fits"][0]["line"] == line
    assert {c["kind"] for c in d["cures"]} == {"stack-limit", "other-process"}
    assert d["room"]["missing_bytes"] == 2_701_131_776 - 2_287_534_080


def test_eager_module_loading_in_a_pytorch_process():
    """PyTorch, no start budget: 2,000 MiB of this process outside its 100 MiB pool (NVML) is
    eager-loading territory; LAZY leaves 564,985,856 B, so the cure gives back the rest (estimated)."""
    rows = [(SA, 100, 0x1000), (M, 100, 0x1000), (OO, 300, 0)]
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] * MIB for r in rows], np.uint64)
    ev = Events.build(op, size, addr=np.array([r[2] * MIB for r in rows], np.uint64),
                      rounded=np.where(op == SA, 0, size).astype(np.uint64))
    state = {"seq": 2, "device": 0, "mem_free": 50 * MIB, "mem_total": 1024 * MIB,
             "limits": {"stack_size": 1024, "malloc_heap_size": 8 * MIB, "printf_fifo_size": MIB},
             "processes": [{"pid": 9, "name": "python", "used_bytes": 2100 * MIB, "self": True}],
             "pool": {"used_bytes": 100 * MIB, "total_bytes": 100 * MIB, "limit_bytes": 0}}
    meta = TraceMeta.new(Source.TORCH, device=DeviceInfo("GPU", 1024 * MIB, 1000 * MIB)).with_extra(
        oom_states=[state], exit={"status": "exception", "oom_seq": 2, "exception": "OutOfMemoryError"})
    r = advise(Trace(None, meta, ev, pair_events(ev.op, ev.addr, ev.device, ev.seq).mate, None, ()), jobs=1)
    assert r.room is not None and r.limit == 150 * MIB
    o = cure(r, Kind.MODULE_LOADING)
    (c,) = o.candidate.cures
    assert (c.returns, c.how.value) == (2000 * MIB - 564_985_856, "estimated")
    assert c.action == "export CUDA_MODULE_LOADING=LAZY" and o.fits and r.room.pick is o


def test_the_room_is_per_device():
    """Device 0 holds 500 MiB and never ran out; device 1 is the worked example (its own room,
    350 MiB, and its own other process). Device 0's start budget says nothing of device 1, so no
    stack cure is sized there."""
    t = v2_trace(400)
    n = len(t.events)
    op = np.r_[np.array([SA, M], np.int8), t.events.op]
    size = np.r_[np.array([500 * MIB] * 2, np.uint64), t.events.size]
    addr = np.r_[np.array([0x80000 * MIB] * 2, np.uint64), t.events.addr]
    ev = Events.build(op, size, addr=addr, rounded=np.where(op == SA, 0, size).astype(np.uint64),
                      device=np.r_[np.zeros(2, np.int32), np.ones(n, np.int32)], sites=t.events.sites,
                      site=np.r_[np.array([-1, -1], np.int32), t.events.site])
    state = dict(t.meta.extra["oom_states"][0], seq=6, device=1)
    meta = t.meta.with_extra(oom_states=[state], exit=dict(t.meta.extra["exit"], oom_seq=6),
                             budget=dict(t.meta.extra["budget"], device=0))
    r = advise(Trace(None, meta, ev, pair_events(ev.op, ev.addr, ev.device, ev.seq).mate, None, ()), jobs=1)
    one = next(d for d in r.devices if d.device == 1)
    assert r.device == 1 and r.room is not None and r.limit == 350 * MIB == one.limit
    assert {o.candidate.kind for o in r.room.tried} == {Kind.OTHER_PROCESS}
    zero = next(d for d in r.devices if d.device == 0)
    assert zero.room is None and zero.failing_seq is None and zero.lower_bound == 500 * MIB
