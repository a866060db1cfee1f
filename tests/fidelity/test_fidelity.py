"""Fidelity: the ``cupy`` and ``torch`` policies replay real GPU traces as the real allocators ran them.

Each committed trace under ``traces/`` was recorded on an NVIDIA H200 (CuPy
14.2 pool traces by ``tracekit record``; PyTorch 2.11 snapshots imported by
``tracekit import torch``). The replay runs under the recorded pool limit and
allocator settings and must reproduce the recorded allocator's own history:
the sizes of its device allocations in order (``segment_alloc``; for
expandable segments, the bytes mapped per request), the reserved bytes after
every request, the request that raised out-of-memory, and where the traces
carry them, the address of every block. Run this file as a script to print
the agreement table quoted in ``docs/fidelity.md``.
"""

from __future__ import annotations

import gzip
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tracekit.sim import policies
from tracekit.sim.base import Allocator, PolicyRun, SimConfig, Stat, Status
from tracekit.sim.engine import ReplayResult
from tracekit.sim.engine import replay as sim_replay
from tracekit.sim.policies.cupy_pool import MODEL as CUPY
from tracekit.sim.policies.torch_caching import MODEL as TORCH
from tracekit.sim.pool_run import retry_releases
from tracekit.sim.prepare import prepare
from tracekit.sim.torch_rules import options_from_snapshot
from tracekit.trace import Op, Source, Trace, read_trace
from tracekit.trace.outcome import handled_rows

TRACES = Path(__file__).resolve().parents[2] / "traces"
FILES = sorted(p.name for p in TRACES.glob("*.parquet")) if TRACES.is_dir() else []
ASYNC = ("MemoryAsyncPool: CUDA's stream-ordered allocator has no pool segments for the cupy policy to "
         "reproduce (the cupy-async policy's figures: test_async_pool_*)")
# Version-2 recordings the replay does not reproduce yet, and why (strict: a fix shows up as XPASS).
DEPARTS = {
    "cupy-async.parquet": ASYNC,
    "cupy-user-pool.parquet": "the program's own free_all_blocks(stream) releases segments at no request",
}
# The seed scenario and its cures each run until the device (not the pool) runs out.
DEVICE_RAN_OUT = ("the device ran out (another process and the local memory held it), not the pool; the "
                  "replay is given no device capacity from the recorded device_free")
DEPARTS.update({n: DEVICE_RAN_OUT for n in FILES if n.startswith("cupy-seed")})


def _known(names: list[str], departs: dict[str, str]) -> list[object]:
    known = {n: pytest.param(n, marks=pytest.mark.xfail(reason=r, strict=True)) for n, r in departs.items()}
    return [known.get(n, n) for n in names]


@dataclass(frozen=True)
class Agreement:
    """How one replay compares with the recorded allocator (counts, and first misses as input index)."""

    requests: int
    reserved_same: int
    first_reserved_miss: int  # -1 when every request agrees
    seg_real: tuple[int, ...]  # non-initial segment_alloc sizes, recorded
    seg_sim: tuple[int, ...]
    mapped_real: tuple[int, ...]  # bytes of device memory taken per request that took any
    mapped_sim: tuple[int, ...]
    oom_real: int  # index of the recorded oom row the program died of (not one it survived), -1 none
    oom_sim: int
    mallocs: int
    same_address: int
    handled_real: int = 0  # recorded oom rows the program survived
    handled_sim: int = 0  # requests the replay saw fail and went on from, as the program did


def _attach(ev_op: np.ndarray, req: np.ndarray) -> np.ndarray:
    """Per input row: the index of the first request at or after it (n when none)."""
    n = len(ev_op)
    nxt = np.where(req, np.arange(n), n)
    return np.minimum.accumulate(nxt[::-1])[::-1]


def replay(trace: Trace, extra: dict[str, str] | None = None) -> PolicyRun:
    """The matching policy under the recorded limit and settings (plus ``extra`` options).

    Past a failed request, as the recorded program went on when it caught the error."""
    if trace.meta.source == Source.TORCH:
        opts = options_from_snapshot(trace.meta.extra.get("torch_allocator_settings") or {})
        return TORCH.run(trace, SimConfig(trace.meta.pool_limit_bytes, continue_on_oom=True,
                                          options={**opts, **(extra or {})}))
    return CUPY.run(trace, SimConfig(trace.meta.pool_limit_bytes, continue_on_oom=True, options=extra or {}))


def agreement(trace: Trace, extra: dict[str, str] | None = None) -> Agreement:
    ev = trace.events
    n = len(ev)
    r = replay(trace, extra)
    init = prepare(trace).initial
    req = ((ev.op == Op.MALLOC) | (ev.op == Op.FREE) | (ev.op == Op.OOM)) & ~init
    at = _attach(ev.op, req)
    sign = np.where(ev.op == Op.SEGMENT_ALLOC, 1, np.where(ev.op == Op.SEGMENT_FREE, -1, 0))
    real_delta = np.zeros(n + 1, np.int64)
    np.add.at(real_delta, at, sign * ev.size.astype(np.int64))
    sim_at = _attach(ev.op, req)[np.minimum(r.rows_before, n - 1)] if n else r.rows_before
    sim_at = np.where(r.rows_before >= n, n, sim_at)
    sim_sign = np.where(r.rows_op == Op.SEGMENT_ALLOC, 1, -1)
    sim_delta = np.zeros(n + 1, np.int64)
    np.add.at(sim_delta, sim_at, sim_sign * r.rows_size.astype(np.int64))
    ran = req & (r.status != Status.IGNORED)
    idx = np.flatnonzero(ran)
    real_res, sim_res = np.cumsum(real_delta)[idx], np.cumsum(sim_delta)[idx]
    miss = idx[real_res != sim_res]
    seg = (ev.op == Op.SEGMENT_ALLOC) & ~init
    sim_init = np.zeros(len(r.rows_before), bool)
    inside = r.rows_before < n
    sim_init[inside] = init[r.rows_before[inside]]
    sim_seg = (r.rows_op == Op.SEGMENT_ALLOC) & ~sim_init
    mapped_real = np.zeros(n + 1, np.int64)
    np.add.at(mapped_real, at[seg], ev.size[seg].astype(np.int64))
    mapped_sim = np.zeros(n + 1, np.int64)
    np.add.at(mapped_sim, sim_at[sim_seg], r.rows_size[sim_seg].astype(np.int64))
    handled = handled_rows(ev, trace.meta.extra)
    ooms = np.flatnonzero((ev.op == Op.OOM) & ~handled)
    m = np.flatnonzero((ev.op == Op.MALLOC) & ~init & (r.status == Status.DONE))
    return Agreement(
        requests=len(idx), reserved_same=len(idx) - len(miss),
        first_reserved_miss=int(miss[0]) if len(miss) else -1,
        seg_real=tuple(int(x) for x in ev.size[seg]), seg_sim=tuple(int(x) for x in r.rows_size[sim_seg]),
        mapped_real=tuple(int(x) for x in mapped_real[mapped_real > 0]),
        mapped_sim=tuple(int(x) for x in mapped_sim[mapped_sim > 0]),
        oom_real=int(ooms[0]) if len(ooms) else -1, oom_sim=int(r.stats[Stat.FIRST_OOM]),
        mallocs=len(m), same_address=int(np.count_nonzero(ev.addr[m] == r.addr[m])),
        handled_real=int(np.count_nonzero(handled)), handled_sim=int(r.stats[Stat.HANDLED]),
    )


def _expandable(trace: Trace) -> bool:
    return bool((trace.meta.extra.get("torch_allocator_settings") or {}).get("expandable_segments"))


@pytest.mark.parametrize("name", _known(FILES, DEPARTS))
def test_replay_reproduces_the_recorded_allocator(name: str) -> None:
    trace = read_trace(TRACES / name)
    a = agreement(trace)
    assert a.requests > 0
    assert a.first_reserved_miss == -1, f"reserved bytes differ first at input row {a.first_reserved_miss}"
    assert a.reserved_same == a.requests
    if _expandable(trace):
        # The importer cuts each mapping into cells of the segment grid; compare bytes per request.
        assert a.mapped_sim == a.mapped_real
    else:
        assert a.seg_sim == a.seg_real
    assert a.oom_sim == a.oom_real  # the replay follows the program to the OOM it died of
    assert a.handled_sim == a.handled_real  # and every request it survived fails there too


@pytest.mark.parametrize("name", _known(FILES, {"cupy-async.parquet": ASYNC}))
def test_every_block_lands_where_the_gpu_put_it(name: str) -> None:
    a = agreement(read_trace(TRACES / name))
    if name == "torch-wrap.parquet":
        # The ring buffer wrapped: blocks live at its start that are freed inside it have unknown
        # block sizes (history keeps the requested size). The importer assumes round_size, but
        # PyTorch can leave up to 1 MiB unsplit in a large block; two later requests land 1 MiB
        # lower than on the GPU. Reserved bytes and segments still agree (test above).
        assert a.mallocs - a.same_address == 2
    else:
        assert a.same_address == a.mallocs


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        raise pickle.UnpicklingError(f"global {module}.{name} is forbidden")


@pytest.mark.parametrize(("snapshot", "keep"), [
    ("torch-oom", 5000), ("torch-tuned", 7000), ("torch-expandable", 10000), ("torch-train", 3000),
])
def test_wrapped_ring_buffer_replays_from_the_rebuilt_state(snapshot: str, keep: int, tmp_path: Path) -> None:
    """Keep only the last ``keep`` history entries, as a smaller ring buffer would have.

    The importer rebuilds the state at the cut from the final segments; the
    replay starts from it and must still match PyTorch from there on
    (expandable segments included).
    """
    from tracekit.importers.torch_snapshot import import_snapshot

    src = TRACES / f"{snapshot}.pickle.gz"
    if not src.exists():
        pytest.skip(f"{src.name} not committed")
    with gzip.open(src) as f:
        snap = _NoGlobals(f).load()
    snap["device_traces"] = [t[-keep:] for t in snap["device_traces"]]
    cut = tmp_path / f"{snapshot}-{keep}.pickle"
    cut.write_bytes(pickle.dumps(snap))
    import_snapshot(cut, tmp_path / "cut.parquet")
    trace = read_trace(tmp_path / "cut.parquet")
    assert prepare(trace).initial.any()
    a = agreement(trace)
    assert a.first_reserved_miss == -1 and a.reserved_same == a.requests
    assert a.mapped_sim == a.mapped_real
    assert a.oom_sim == a.oom_real
    assert a.same_address == a.mallocs


def _recorded_free_gaps(trace: Trace, upto: int) -> dict[int, int]:
    """Free gaps (start -> bytes) of the recorded pool just before row ``upto``."""
    ev = trace.events
    segs: dict[int, int] = {}
    live: dict[int, int] = {}
    for j in range(upto):
        o, a = int(ev.op[j]), int(ev.addr[j])
        if o == Op.SEGMENT_ALLOC:
            segs[a] = int(ev.size[j])
        elif o == Op.SEGMENT_FREE:
            segs.pop(a)
        elif o == Op.MALLOC:
            live[a] = int(ev.rounded[j])
        elif o == Op.FREE:
            live.pop(a)
    gaps: dict[int, int] = {}
    blocks = sorted(live.items())
    for base, size in segs.items():
        cur = base
        for b, sz in blocks:
            if base <= b < base + size:
                if b > cur:
                    gaps[cur] = b - cur
                cur = b + sz
        if cur < base + size:
            gaps[cur] = base + size - cur
    return gaps


CUPY_FILES = [f for f in FILES if f.startswith("cupy-")]


@pytest.mark.parametrize("name", _known(CUPY_FILES, {"cupy-async.parquet": ASYNC}))
def test_cupy_lowest_address_rule_departs_only_at_ties(name: str) -> None:
    """Without the recorded tie choices, the first different block is a tie between equal chunks."""
    trace = read_trace(TRACES / name)
    ev = trace.events
    r = CUPY.run(trace, SimConfig(capacity=trace.meta.pool_limit_bytes, options={"ties": "address"}))
    m = np.flatnonzero((ev.op == Op.MALLOC) & (r.status == Status.DONE))
    differ = m[ev.addr[m] != r.addr[m]]
    if len(differ) == 0:
        return
    i = int(differ[0])
    gaps = _recorded_free_gaps(trace, i)
    need = int(ev.rounded[i])
    best = min(g for g in gaps.values() if g >= need)
    assert gaps[int(ev.addr[i])] == gaps[int(r.addr[i])] == best
    assert int(r.addr[i]) < int(ev.addr[i])  # the replay took the lowest address, CuPy another


@pytest.mark.skipif("cupy-oom-frag.parquet" not in FILES, reason="trace not committed")
def test_cli_replay_of_the_cupy_oom_fails_at_the_recorded_request() -> None:
    """End to end: ``tracekit replay --sim cupy`` under CuPy's 256 MiB limit exits 3 at seq 164."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(TRACES.parent)}
    cmd = [sys.executable, "-m", "tracekit", "replay", str(TRACES / "cupy-oom-frag.parquet"),
           "--sim", "cupy", "--capacity", "256MiB", "--json", "--fail-on-oom"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=TRACES.parent, check=False)
    assert p.returncode == 3, p.stderr
    oom = json.loads(p.stdout)["oom"]
    assert oom["seq"] == 164 and oom["size"] == 64 << 20
    assert oom["largest_free_block"] == 56 << 20 and oom["reserved_bytes"] == 243 * (1 << 20) + (1 << 19)


@pytest.mark.parametrize(("name", "mib", "cap_gib", "retries"),
                         [("torch-maxsplit", 64, 3, 295), ("torch-maxsplit-b", 200, 2, 261)])
def test_max_split_snapshots_retry_through_release_available(name: str, mib: int, cap_gib: int,
                                                             retries: int) -> None:
    """The snapshots recorded for the release path: PyTorch released cached memory while retrying
    hundreds of requests under a tight cap, and the program once on its own (``empty_cache``)."""
    trace = read_trace(TRACES / f"{name}.parquet")
    assert trace.meta.extra["torch_allocator_settings"]["max_split_size"] == mib << 20
    assert trace.meta.pool_limit_bytes == cap_gib << 30
    inp = prepare(trace)
    own, retry = retry_releases(trace.events.op, inp.size, inp.initial)
    assert int(own.sum()) == 1 and int((retry > 0).sum()) == retries
    a = agreement(trace)
    assert a.first_reserved_miss == -1 and a.seg_sim == a.seg_real and a.same_address == a.mallocs

# -- the device-allocator models (cuda, cupy-async) against what the H200 measured ---------------------

MIB = 1 << 20
ASYNC_TRACE = TRACES / "cupy-async.parquet"
ASYNC_CAUSE = ("the driver's pool grew by 64 and 66 MiB, then in steps of 32 or 64 MiB, to 736 MiB "
               "(ReservedMemCurrent at the end; device_free fell 738 MiB) for at most 501 MiB live: it does "
               "not pack the live bytes into 2 MiB pages as the model does (peak 502 MiB): its own pool "
               "fragments")


def _async_model(trace: Trace, capacity: int | None = None) -> ReplayResult:
    return sim_replay(trace, policies.modelling(Allocator.CUPY_ASYNC), SimConfig(capacity=capacity))


def _recorded_async_pool(trace: Trace) -> dict[str, int]:
    """The recording's own figures for its MemoryAsyncPool: reserved at the end (the driver's
    ReservedMemCurrent), and how far the device's free memory fell from the start."""
    extra = trace.meta.extra
    k = next(p["id"] for p in extra["pools"] if p["kind"] == "async")
    free = np.asarray(trace.extras.column("device_free").to_numpy(zero_copy_only=False))  # type: ignore[union-attr]
    return {"reserved_end": int(extra["pools_end"][k]["total_bytes"]),
            "device_drop": int(extra["budget"]["cuda_free"]) - int(free.min())}


@pytest.mark.skipif(not ASYNC_TRACE.exists(), reason="trace not committed")
def test_async_pool_model_keeps_what_the_recorded_pool_kept() -> None:
    """What the model takes as exact, on the recording: the live bytes (CuPy's 512 B rounding), and
    that the pool gave nothing back (CuPy's release threshold): the device's free memory never rose
    while 80 blocks were freed, and after the first two requests each time it fell the pool grew by
    a multiple of 32 MiB."""
    trace = read_trace(ASYNC_TRACE)
    free = np.asarray(trace.extras.column("device_free").to_numpy(zero_copy_only=False))  # type: ignore[union-attr]
    assert (np.diff(free) <= 0).all()
    steps = -np.diff(free)
    assert (steps[1:][steps[1:] > 0] % (32 * MIB) == 0).all()
    ev = trace.events
    s = _async_model(trace).summary
    live = np.cumsum(np.where(ev.op == Op.MALLOC, ev.rounded.astype(np.int64),
                              -np.where(ev.op == Op.FREE, ev.rounded[np.maximum(trace.mate, 0)], 0)
                              .astype(np.int64)))
    assert s.peak_live_bytes == int(live.max()) == 501 * MIB
    rec = _recorded_async_pool(trace)
    got = (s.peak_reserved_bytes, rec["reserved_end"], rec["device_drop"])
    assert got == (502 * MIB, 736 * MIB, 738 * MIB)
    assert s.peak_reserved_bytes <= rec["reserved_end"]  # the model is optimistic, never the other way


@pytest.mark.skipif(not ASYNC_TRACE.exists(), reason="trace not committed")
@pytest.mark.xfail(reason=ASYNC_CAUSE, strict=True)
def test_async_pool_model_peak_is_the_recorded_pool_reserved() -> None:
    trace = read_trace(ASYNC_TRACE)
    assert _async_model(trace).summary.peak_reserved_bytes == _recorded_async_pool(trace)["reserved_end"]


FRAG = TRACES / "cupy-oom-frag.parquet"


@pytest.mark.skipif(not FRAG.exists(), reason="trace not committed")
def test_cuda_model_peak_is_the_device_replay_peak() -> None:
    """``replay --device 0 --allocator cuda --capacity 256MiB`` of cupy-oom-frag on the H200
    (2026-12-01, docs/fidelity.md): it fit, at a peak of 228,589,568 bytes; the model's figure."""
    cuda = policies.modelling(Allocator.CUDA)
    s = sim_replay(read_trace(FRAG), cuda, SimConfig(capacity=256 * MIB)).summary
    assert s.oom is None and s.peak_reserved_bytes == 228_589_568


@pytest.mark.skipif(not FRAG.exists(), reason="trace not committed")
@pytest.mark.xfail(reason="on the H200 the real MemoryAsyncPool ran out at seq 80 with 256 MiB held and "
                   "63.5 MiB live (a 64 MiB request); the model, with no fragmentation inside the pool, fits",
                   strict=True)
def test_async_pool_model_fails_where_the_device_replay_did() -> None:
    s = _async_model(read_trace(FRAG), 256 * MIB).summary
    assert s.oom is not None and s.oom.seq == 80


def _seq(trace: Trace, i: int) -> str:
    return "-" if i < 0 else str(int(trace.events.seq[i]))


def main() -> None:
    """Print the agreement of every committed trace (the tables in docs/fidelity.md)."""
    variants = (("defaults", None), ("ties:address (cupy)", {"ties": "address"}),
                ("addresses:invent", {"addresses": "invent"}),
                ("release_points:none", {"release_points": "none"}))
    for title, extra in variants:
        print(f"\n{title}\n")
        print("| trace | requests | reserved agrees (first miss seq) | device allocations real/replay "
              "| same sizes | OOM seq real/replay | blocks at the GPU's address |")
        print("|---|---|---|---|---|---|---|")
        for name in FILES:
            if title.endswith("(cupy)") and not name.startswith("cupy-"):
                continue
            trace = read_trace(TRACES / name)
            a = agreement(trace, extra)
            same = a.mapped_sim == a.mapped_real if _expandable(trace) else a.seg_sim == a.seg_real
            miss = "" if a.first_reserved_miss < 0 else f" ({_seq(trace, a.first_reserved_miss)})"
            print(f"| {name} | {a.requests:,} | {a.reserved_same:,}{miss} "
                  f"| {len(a.seg_real)}/{len(a.seg_sim)} "
                  f"| {'yes' if same else 'no'} | {_seq(trace, a.oom_real)}/{_seq(trace, a.oom_sim)} "
                  f"| {a.same_address:,}/{a.mallocs:,} |")


if __name__ == "__main__":
    main()
