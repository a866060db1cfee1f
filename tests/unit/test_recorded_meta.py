"""The recorder's metadata keys, typed once (``tracekit.trace.recorded``): what each key becomes, and that
missing, malformed, negative or oversized values are left out exactly as the readers it replaced did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.recorded import (
    MAX_ENTRIES,
    MAX_STATES,
    Budget,
    DeviceLimits,
    ExitInfo,
    OOMEntry,
    OOMState,
    PoolEnd,
    PoolInfo,
    ProcessUse,
    RecordedMeta,
    RerunCommand,
    StackSettings,
    TorchSettings,
    as_bytes,
    as_int,
)

STATE: dict[str, Any] = {
    "seq": 812, "device": 0, "t_ns": 1234567, "mem_free": 122683392, "mem_total": 150110011392,
    "processes": [{"pid": 4242, "name": "python", "used_bytes": 143666544640, "self": False},
                  {"pid": 5151, "name": "python", "used_bytes": 4194304000, "self": True}],
    "limits": {"stack_size": 16384, "malloc_heap_size": 8388608, "printf_fifo_size": 1048576},
    "pool": {"used_bytes": 8388608, "total_bytes": 8388608, "limit_bytes": None},
}


def test_no_keys_is_the_empty_view() -> None:
    r = RecordedMeta.from_extra({})
    assert r == RecordedMeta()
    assert r.exit is None and r.oom_states == {} and r.ooms == () and r.pools == () and r.pools_end == ()
    assert r.budget == Budget() and r.device_limits == DeviceLimits() and r.stacks == StackSettings()
    assert r.home_device([3, 4]) == 3 and r.home_device([]) is None


def test_a_v2_recording_reads_into_its_dataclasses() -> None:
    r = RecordedMeta.from_extra({
        "device_id": 1,
        "oom_states": [STATE],
        "ooms": [{"seq": 812, "kind": "oom", "device": 0, "size": 1000, "rounded": 1024,
                  "exception": "OutOfMemoryError", "message": "out of memory", "pool_id": 0}],
        "pools": [{"id": 0, "device": 0, "kind": "pool", "label": "default", "limit_bytes": 0},
                  {"id": 1, "device": 0, "kind": "pool", "label": "user 1", "limit_bytes": 1 << 30}],
        "pools_end": [{"used_bytes": 0, "total_bytes": 512, "limit_bytes": 0, "free_bytes": 512,
                       "n_free_blocks": 1}, None],
        "exit": {"status": "exception", "exception": "cupy.cuda.memory.OutOfMemoryError", "code": 1,
                 "oom_seq": 812, "message": "out of memory"},
        "device_limits": {"stack_size": 1024, "malloc_heap_size": 8388608, "printf_fifo_size": None},
        "recorder": {"call_sites": True, "stack_depth": 64, "pid": 7},
        "sites_relative_to": ["/work", "/usr/lib/python3"],
    })
    st = r.oom_states[812]
    assert st.mem_free == 122683392 and st.mem_total == 150110011392 and st.pool_limit is None
    assert st.limits == DeviceLimits(16384, 8388608, 1048576)
    assert st.self_used == 4194304000 and st.others == (ProcessUse(4242, "python", 143666544640, False),)
    assert r.ooms == (OOMEntry(812, "out of memory", "OutOfMemoryError", 0, 1000, 1024, 0),)
    assert r.pools == (PoolInfo(0, 0, "pool", "default", 0), PoolInfo(1, 0, "pool", "user 1", 1 << 30))
    assert r.pool_limits == {(0, 0): None, (0, 1): 1 << 30}
    assert r.pools_end == (PoolEnd(0, 512, 0, 512, 1), None)
    assert r.exit == ExitInfo("exception", "cupy.cuda.memory.OutOfMemoryError", 1, 812, "out of memory")
    assert r.exit is not None and not r.exit.survived
    assert r.device_limits == DeviceLimits(1024, 8388608, None)
    assert r.stacks == StackSettings(True, 64, ("/work", "/usr/lib/python3"))
    assert r.home_device([0]) == 1


def test_wrong_types_are_left_out() -> None:
    r = RecordedMeta.from_extra({
        "device_id": "1", "oom_states": {"seq": 1}, "ooms": "many", "pools": {"id": 0}, "pools_end": 3,
        "exit": "ok", "device_limits": [1, 2], "budget": "failed", "recorder": None, "sites_relative_to": "/",
    })
    assert r == RecordedMeta()


def test_malformed_entries_are_skipped_one_by_one() -> None:
    r = RecordedMeta.from_extra({
        "oom_states": [None, 5, {"device": 0}, {"seq": True}, {"seq": 1.5}, {"seq": "3"},
                       {"seq": 2.0, "mem_free": "lots", "processes": "nvml", "limits": 7, "pool": []},
                       {"seq": 4, "processes": [{"pid": 1}, {"used_bytes": 5}, 9, {"pid": 2, "used_bytes": 6,
                                                                                  "self": 1}]}],
        "ooms": [{"message": "no seq"}, [], {"seq": 9, "message": 5}],
        "pools": [{"id": 0}, {"device": 0}, {"id": True, "device": 0}, {"id": 2, "device": 0, "kind": 3}],
        "pools_end": [{"used_bytes": -1}, "x"],
        "exit": {"status": 1, "exception": None, "code": 1.5, "oom_seq": "812", "message": b"x"},
        "recorder": {"call_sites": "yes", "stack_depth": -1},
        "sites_relative_to": ["/a", 3, None, "/b"],
    })
    assert r.oom_states == {2: OOMState(2), 4: OOMState(4, processes=(ProcessUse(2, None, 6, False),))}
    assert r.oom_states[2].processes is None
    assert r.ooms == (OOMEntry(9),)
    assert r.pools == (PoolInfo(2, 0),)
    assert r.pools_end == (PoolEnd(), None)
    assert r.exit == ExitInfo()
    assert r.stacks == StackSettings(None, None, ("/a", "/b"))


def test_negative_and_out_of_range_sizes_are_unknown() -> None:
    state = {**STATE, "mem_free": -1, "mem_total": 2**64, "pool": {"used_bytes": -5, "total_bytes": 1e300,
                                                                  "limit_bytes": -1},
             "limits": {"stack_size": -1024, "malloc_heap_size": float("nan"), "printf_fifo_size": False}}
    r = RecordedMeta.from_extra({
        "oom_states": [state],
        "pools": [{"id": 0, "device": 0, "limit_bytes": -1}, {"id": 1, "device": 0, "limit_bytes": 2**70}],
        "device_limits": {"stack_size": -1},
        "budget": {"context_bytes": -3, "sm_count": -1, "other_processes_bytes": 2**63},
    })
    st = r.oom_states[812]
    assert (st.mem_free, st.mem_total, st.pool_used, st.pool_total, st.pool_limit) == (None,) * 5
    assert st.limits == DeviceLimits()
    assert r.pool_limits == {(0, 0): None, (0, 1): None}
    assert r.device_limits == DeviceLimits()
    assert (r.budget.context, r.budget.sm_count, r.budget.others_bytes) == (None, None, None)
    assert as_int(2**63) is None and as_int(-(2**63)) == -(2**63) and as_bytes(-1) is None
    assert as_int(True) is None and as_int(3.0) == 3 and as_int(3.5) is None


def test_huge_lists_are_bounded() -> None:
    r = RecordedMeta.from_extra({
        "oom_states": [{"seq": i} for i in range(MAX_STATES + 5)],
        "ooms": [{"seq": i} for i in range(MAX_STATES + 5)],
        "pools": [{"id": i, "device": 0} for i in range(MAX_ENTRIES + 5)],
        "pools_end": [None] * (MAX_ENTRIES + 5),
        "sites_relative_to": ["/x"] * (MAX_ENTRIES + 5),
    })
    assert len(r.oom_states) == MAX_STATES and max(r.oom_states) == MAX_STATES - 1
    assert len(r.ooms) == MAX_STATES
    assert len(r.pools) == len(r.pool_limits) == MAX_ENTRIES
    assert len(r.pools_end) == MAX_ENTRIES and len(r.stacks.relative_to) == MAX_ENTRIES
    procs = [{"pid": i, "used_bytes": 1} for i in range(MAX_ENTRIES + 5)]
    s = OOMState.from_extra({"seq": 0, "processes": procs})
    assert s is not None and s.processes is not None and len(s.processes) == MAX_ENTRIES
    b = Budget.from_extra({"other_processes": procs})
    assert b.others is not None and len(b.others) == MAX_ENTRIES


def test_repeated_keys_the_last_entry_wins() -> None:
    r = RecordedMeta.from_extra({
        "oom_states": [{"seq": 1, "mem_free": 10}, {"seq": 1, "mem_free": 20}],
        "pools": [{"id": 0, "device": 0, "limit_bytes": 10}, {"id": 0, "device": 0, "limit_bytes": 20}],
    })
    assert r.oom_states[1].mem_free == 20 and r.pool_limits == {(0, 0): 20} and len(r.pools) == 2


def test_budget() -> None:
    b = Budget.from_extra({
        "device": 2, "context_bytes": 500, "other_processes_bytes": 7, "sm_count": 132,
        "max_threads_per_sm": 2048, "cupy_pool_total_bytes": 4, "cupy_pool_used_bytes": 3,
        "stack_size": 1024, "malloc_heap_size": 8, "printf_fifo_size": 16, "note": "x", "ratio": 1.5,
        "as_text": "12", "flag": True,
        "other_processes": [{"pid": 9, "name": "x", "bytes": 100}, {"pid": 8, "used_bytes": 50}, {"pid": "7"},
                            {"pid": 6, "bytes": -1}],
    })
    assert (b.device, b.context, b.others_bytes, b.sm_count, b.threads_per_sm, b.pool_total, b.pool_used) == \
        (2, 500, 7, 132, 2048, 4, 3)
    assert b.limits == DeviceLimits(1024, 8, 16)
    assert b.others == (ProcessUse(9, "x", 100, False), ProcessUse(8, None, 50, False),
                        ProcessUse(6, None, 0, False))
    assert dict(b.terms) == {
        "device": 2, "context_bytes": 500, "other_processes_bytes": 7, "sm_count": 132,
        "max_threads_per_sm": 2048, "cupy_pool_total_bytes": 4, "cupy_pool_used_bytes": 3,
        "stack_size": 1024, "malloc_heap_size": 8, "printf_fifo_size": 16, "ratio": 1, "as_text": 12}
    assert RecordedMeta.from_extra({"budget": {"device": 5}}).home_device([0]) == 5
    assert RecordedMeta.from_extra({"device_id": 1, "budget": {"device": 5}}).home_device([0]) == 1


def test_exit_survived() -> None:
    assert ExitInfo("ok").survived and ExitInfo("signal").survived
    assert ExitInfo(code=0).survived and not ExitInfo(code=1).survived
    assert not ExitInfo("exception", "torch.OutOfMemoryError").survived
    assert not ExitInfo("exception", "RuntimeError", message="CUDA out of memory. Tried").survived
    assert ExitInfo("exception", "ValueError", message="bad").survived


def test_trace_meta_parses_once_and_a_copy_parses_its_own() -> None:
    meta = TraceMeta.new(Source.CUPY, extra={"exit": {"status": "ok"}})
    assert meta.recorded is meta.recorded
    assert meta.recorded.exit == ExitInfo("ok")
    other = meta.with_extra(exit={"status": "signal"})
    assert other.recorded.exit == ExitInfo("signal") and meta.recorded.exit == ExitInfo("ok")
    assert RecordedMeta.of(meta.recorded) is meta.recorded
    assert RecordedMeta.of({"device_id": 3}).device_id == 3


def test_the_reader_gives_the_typed_view(tmp_path: Path) -> None:
    ev = Events.build(op=np.array([Op.MALLOC, Op.OOM], np.int8), size=np.array([1000, 1 << 20], np.uint64),
                      addr=np.array([0x7F0000000000, 0], np.uint64),
                      rounded=np.array([1024, 1 << 20], np.uint64))
    extra = {"oom_states": [{"seq": 1, "mem_free": 5}], "exit": {"status": "exception", "oom_seq": 1},
             "pools": [{"id": 0, "device": 0, "limit_bytes": 4096}]}
    path = tmp_path / "t.parquet"
    write_trace(path, TraceMeta.new(Source.CUPY, extra=extra), ev)
    t = read_trace(path)
    assert t.meta.extra["exit"] == extra["exit"]  # the raw mapping stays as it is
    assert t.meta.recorded.oom_states == {1: OOMState(1, mem_free=5)}
    assert t.meta.recorded.exit == ExitInfo("exception", oom_seq=1)
    assert t.meta.recorded.pool_limits == {(0, 0): 4096}


def test_torch_settings_as_recorded_and_as_imported() -> None:
    snap = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "expandable_segments": True,
            "garbage_collection_threshold": 0.6, "max_split_size": 1 << 62}
    s = RecordedMeta.from_extra({"torch_allocator_settings": snap}).torch_settings
    assert s.raw == snap and s.snapshot == snap
    assert s.alloc_conf == "expandable_segments:True" and s.gc_threshold == 0.6 and s.expandable_segments
    # an imported snapshot's flags are text; the recorder's conf may be blank
    s = TorchSettings.from_extra({"expandable_segments": " Yes ", "PYTORCH_CUDA_ALLOC_CONF": "  "})
    assert s.expandable_segments and s.alloc_conf is None and s.gc_threshold == 0.0


def test_torch_settings_malformed_are_the_defaults() -> None:
    for bad in (None, [], "expandable_segments:True", 7):
        s = TorchSettings.from_extra(bad)
        assert s.raw is None and s.snapshot == {} and s.alloc_conf is None
        assert s.gc_threshold == 0.0 and not s.expandable_segments
    for gc in (0, 1, 1.5, -0.2, True, "0.6", float("nan")):
        assert TorchSettings.from_extra({"garbage_collection_threshold": gc}).gc_threshold == 0.0, gc
    assert TorchSettings.from_extra({"PYTORCH_CUDA_ALLOC_CONF": 3}).alloc_conf is None
    assert not TorchSettings.from_extra({"expandable_segments": "no"}).expandable_segments


def test_rerun() -> None:
    r = RecordedMeta.from_extra({"rerun": {"argv": ["app.py", 3], "module": 1, "cwd": "/w",
                                           "limit_bytes": 1 << 30}}).rerun
    assert r == RerunCommand(("app.py", "3"), True, "/w", 1 << 30)
    assert RerunCommand.from_extra({"argv": ["-m", "x"]}) == RerunCommand(("-m", "x"), False, None, None)
    # no limit (0), a negative or non-integer one: none
    for lim in (0, -5, "1G", 2.5, True):
        got = RerunCommand.from_extra({"argv": ["a.py"], "limit_bytes": lim})
        assert got is not None and got.limit_bytes is None, lim
    for bad in (None, {}, {"argv": []}, {"argv": "app.py"}, ["app.py"], {"argv": None}):
        assert RerunCommand.from_extra(bad) is None, bad
