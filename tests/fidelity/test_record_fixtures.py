"""The committed version-2 recordings (traces/, recorded on an H200) hold what the recorder promises.

Each check is a property of the real recording, with the arithmetic that
links the figures: the OOM's measured state names the other process and the
stack limit the kernel raised; every pool's live bytes at the end equal its
own counters; every block lies in a segment of its own pool and device.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.trace import Op, Trace, read_trace

TRACES = Path(__file__).resolve().parents[2] / "traces"
GiB, MiB = 1 << 30, 1 << 20


@pytest.fixture(scope="module")
def seed() -> Trace:
    return read_trace(TRACES / "cupy-seed.parquet", strict=True)


def _pools(t: Trace) -> np.ndarray:
    assert t.extras is not None
    return np.array(t.extras.column("pool").to_pylist(), dtype=object)


def _live(t: Trace, pool: int, op: Op) -> int:
    ev, pools = t.events, _pools(t)
    live = (ev.op == op) & (pools == pool) & (t.mate < 0)
    return int((ev.rounded if op == Op.MALLOC else ev.size)[live].sum())


def test_seed_oom_state_names_the_other_process_and_the_raised_stack_limit(seed: Trace) -> None:
    m = seed.meta.extra
    (state,) = m["oom_states"]
    assert seed.events.op[state["seq"]] == Op.OOM and m["exit"]["oom_seq"] == state["seq"]
    assert m["exit"]["status"] == "exception"
    assert m["exit"]["exception"] == "cupy.cuda.memory.OutOfMemoryError"
    # the helper process holds all but ~6 GiB; this process is another entry
    others = [p for p in state["processes"] if not p["self"]]
    big = max(others, key=lambda p: p["used_bytes"] or 0)
    assert big["used_bytes"] > state["mem_total"] - 7 * GiB
    # the kernel's launch raised the stack limit from the start's value to 16 KiB per thread
    assert m["device_limits"]["stack_size"] < 16384 <= state["limits"]["stack_size"]
    # measured, not derived: far less free than "free at start - pool"
    derived = seed.meta.device.free_bytes - state["pool"]["total_bytes"]  # type: ignore[union-attr]
    assert state["mem_free"] < 1 * GiB and derived - state["mem_free"] > 3 * GiB
    assert state["pool"]["used_bytes"] >= 8 * MiB
    dfree = seed.extras.column("device_free").to_pylist()  # type: ignore[union-attr]
    assert dfree[state["seq"]] == state["mem_free"]


@pytest.mark.parametrize("name", ["cupy-seed", "cupy-user-pool", "cupy-async"])
def test_each_pools_live_bytes_at_the_end_equal_its_own_counters(name: str) -> None:
    t = read_trace(TRACES / f"{name}.parquet", strict=True)
    m = t.meta.extra
    assert len(m["pools"]) == len(m["pools_end"])
    assert [e["id"] for e in m["pools"]] == list(range(len(m["pools"])))
    for entry, end in zip(m["pools"], m["pools_end"], strict=True):
        if end is None:
            continue
        assert _live(t, entry["id"], Op.MALLOC) <= end["used_bytes"]
        if entry["kind"] == "pool":
            assert _live(t, entry["id"], Op.MALLOC) == end["used_bytes"]
            assert _live(t, entry["id"], Op.SEGMENT_ALLOC) == end["total_bytes"]


@pytest.mark.parametrize("name", ["cupy-seed", "cupy-user-pool", "cupy-async"])
def test_every_block_has_its_pool_and_device_rows_are_measured(name: str) -> None:
    t = read_trace(TRACES / f"{name}.parquet", strict=True)
    ev, pools = t.events, _pools(t)
    assert t.meta.schema_version == 2 and t.meta.extra["device_mismatches"] == 0
    block = (ev.op == Op.MALLOC) | (ev.op == Op.FREE)
    assert all(p is not None for p in pools[block])
    kinds = {e["id"]: e["kind"] for e in t.meta.extra["pools"]}
    dfree = np.array(t.extras.column("device_free").to_pylist(), dtype=object)  # type: ignore[union-attr]
    device_level = ~block | np.array([kinds.get(p) == "async" for p in pools])
    assert all(d is not None and d > 0 for d in dfree[device_level])
    assert all(d is None for d in dfree[~device_level])
    sites = [s for s in ev.sites if s]
    assert sites and not any(s.startswith("/work") or s.startswith("/root") for s in sites)


def test_user_pool_trace_keeps_the_programs_pool_apart_from_the_default() -> None:
    t = read_trace(TRACES / "cupy-user-pool.parquet", strict=True)
    labels = {e["label"]: e["id"] for e in t.meta.extra["pools"]}
    user = labels["user 1"]
    pools = _pools(t)
    assert int(np.count_nonzero((t.events.op == Op.SEGMENT_ALLOC) & (pools == user))) > 8
    assert len(np.unique(t.events.stream[(t.events.op == Op.MALLOC) & (pools == user)])) >= 8


def test_async_trace_is_device_level() -> None:
    t = read_trace(TRACES / "cupy-async.parquet", strict=True)
    (entry,) = [e for e in t.meta.extra["pools"] if e["kind"] == "async"]
    rows = _pools(t) == entry["id"]
    assert not np.any(np.isin(t.events.op[rows], [Op.SEGMENT_ALLOC, Op.SEGMENT_FREE]))
    assert int(np.count_nonzero(t.events.op[rows] == Op.MALLOC)) == 80


def test_torch_recording_marks_the_fatal_oom_and_its_snapshot_imports_the_same(tmp_path: Path) -> None:
    from tracekit.importers.torch_snapshot import import_snapshot

    t = read_trace(TRACES / "torch-handled-oom.parquet", strict=True)
    m = t.meta.extra
    ooms = np.flatnonzero(t.events.op == Op.OOM)
    assert len(ooms) >= 2 and [s["seq"] for s in m["oom_states"]] == t.events.seq[ooms].tolist()
    # the last OOM ended the program; the earlier ones were cuDNN's workspace tries, handled
    assert m["exit"]["oom_seq"] == int(t.events.seq[ooms[-1]])
    assert m["exit"]["exception"] == "torch.OutOfMemoryError"
    sites = [t.events.site_name(int(i)) or "" for i in ooms]
    assert all(s.startswith("torchvision/models/resnet.py:") for s in sites)
    sizes = t.events.size[ooms[:-1]].tolist()
    assert sizes == sorted(sizes, reverse=True)  # each try asked for less
    assert all(s["pool"]["limit_bytes"] == t.meta.pool_limit_bytes for s in m["oom_states"])
    again = read_trace(import_snapshot(TRACES / "torch-handled-oom.pickle.gz", tmp_path / "i.parquet").path)
    assert np.array_equal(again.events.op, t.events.op) and np.array_equal(again.events.size, t.events.size)


@pytest.mark.parametrize("path", sorted(TRACES.rglob("*.parquet")), ids=lambda p: str(p.relative_to(TRACES)))
def test_no_committed_trace_carries_a_call_site_path_of_the_machine_that_recorded_it(path: Path) -> None:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    names = pc.unique(pq.read_table(path, columns=["site"]).column("site").combine_chunks().dictionary)
    absolute = [s for s in names.to_pylist() if s and s.startswith(("/work/", "/root/", "/tmp/"))]
    assert not absolute, f"{path.name}: call-sites with absolute paths, e.g. {absolute[:2]}"


def test_the_maxsplit_fixture_names_its_script_relative_to_the_repository() -> None:
    t = read_trace(TRACES / "torch-maxsplit.parquet")
    assert "scripts/torch_workload_maxsplit.py:79:<module>" in t.events.sites
    assert all(not s.startswith("/") for s in t.events.sites if "torch_workload_maxsplit" in s)


@pytest.mark.parametrize("end", ["os_exit", "sigkill"])
def test_a_torch_run_that_never_finished_is_the_run_that_did_from_the_trackers_ring(end: str) -> None:
    """The same ResNet-18 program recorded with ``record --torch`` three times on the GPU: once to
    its end, once ending by ``os._exit(0)``, once by SIGKILL of itself. PyTorch counted 3,297
    allocations each time; the two unfinished runs' traces come from the tracker's ring alone."""
    done = read_trace(TRACES / "torch-ends-normal.parquet", strict=True)
    cut = read_trace(TRACES / f"torch-ends-{end}.parquet", strict=True)
    assert int(np.count_nonzero(cut.events.op == Op.MALLOC)) == 3297  # PyTorch's allocation.all.allocated
    assert np.array_equal(cut.events.op, done.events.op) and np.array_equal(cut.events.size, done.events.size)
    m = cut.meta.extra
    assert m["finished_by"] == "watcher" and m["complete"] is False
    assert m["torch_ring"] == {"rows": 9540, "missing": 0, "frames": False}
    assert done.meta.extra["torch_ring"]["attached"] is True and "finished_by" not in done.meta.extra
    assert np.all(cut.events.site < 0) and np.any(done.events.site >= 0)  # the ring has no frames
