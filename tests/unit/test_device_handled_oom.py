"""Device replays follow the program to the fatal OOM: the cudaMalloc loop over a fake runtime.

The loop is the one ``replay --device N --allocator cuda`` runs; the runtime here is a
10 MiB device in Python (malloc fails past 10 MiB in use), so the handled-OOM paths are
checked with worked answers on any machine. The same ``Loop`` methods serve the CuPy pool
and PyTorch loops (their GPU runs: ``docs/device-replay.md``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tracekit.device.loops import Attempts, Loop, loop_cuda
from tracekit.interrupts import Held
from tracekit.sim.base import Status
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace

MiB = 1 << 20


class FakeRuntime:
    """cudaMalloc/cudaFree over ``cap`` bytes; addresses count up from 1 MiB."""

    class CUDARuntimeError(RuntimeError):
        status = 2  # cudaErrorMemoryAllocation

    def __init__(self, cap: int) -> None:
        self.cap, self.used, self.next, self.held = cap, 0, MiB, {}
        self.calls: list[tuple[str, int]] = []

    def malloc(self, size: int) -> int:
        self.calls.append(("malloc", size))
        if self.used + size > self.cap:
            raise self.CUDARuntimeError("out of memory")
        p, self.next = self.next, self.next + size
        self.used += size
        self.held[p] = size
        return p

    def free(self, p: int) -> None:
        self.calls.append(("free", self.held[p]))
        self.used -= self.held.pop(p)

    def memGetInfo(self) -> tuple[int, int]:
        return self.cap - self.used, self.cap


def _trace(tmp: Path, rows: list[tuple[Op, int, int]]) -> object:
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] for r in rows], np.uint64) * MiB
    addr = np.where(op == Op.OOM, 0, 0x1000_0000 + size).astype(np.uint64)
    ev = Events.build(op, size, addr=addr, rounded=np.where(op == Op.MALLOC, size, 0).astype(np.uint64),
                      site=np.array([r[2] for r in rows], np.int32), sites=("a.py:1", "b.py:2", "c.py:3"))
    return read_trace(write_trace(tmp / "t.parquet", TraceMeta.new(Source.SYNTHETIC), ev))


def _run(trace, cap: int, stop: bool = False) -> tuple[Loop, FakeRuntime]:
    rt = FakeRuntime(cap)
    lp = Loop(len(trace.events), False, None, Held(), Attempts.of(trace, stop))
    loop_cuda(lp, trace.events.op.astype(np.int64), trace.events.size.astype(np.int64),
              trace.mate.astype(np.int64), rt)
    return lp, rt


RETRIED = [(Op.MALLOC, 4, 0), (Op.OOM, 8, 1), (Op.MALLOC, 2, 1), (Op.FREE, 2, 1), (Op.MALLOC, 3, 2),
           (Op.OOM, 32, 2)]


def test_a_handled_failure_goes_on_to_the_fatal_oom(tmp_path: Path) -> None:
    """10 MiB: 4 + 8 fails (handled, as recorded), the 2 MiB retry and 3 MiB fit, the 32 MiB
    request the program died of fails and ends the replay."""
    lp, _ = _run(_trace(tmp_path, RETRIED), 10 * MiB)
    assert lp.handled_ooms == 1 and lp.ooms == 1 and lp.first_oom == 5
    assert lp.status.tolist() == [Status.DONE, Status.OOM, Status.DONE, Status.DONE, Status.DONE, Status.OOM]


def test_stop_at_first_oom_stops_at_the_handled_one(tmp_path: Path) -> None:
    lp, _ = _run(_trace(tmp_path, RETRIED), 10 * MiB, stop=True)
    assert lp.ooms == 1 and lp.first_oom == 1 and lp.handled_ooms == 0


def test_a_served_attempt_stands_in_for_its_retry(tmp_path: Path) -> None:
    """64 MiB: the 8 MiB attempt is served and used in place of the 2 MiB retry (no call for
    it); the retry's free releases the 8 MiB block."""
    lp, rt = _run(_trace(tmp_path, RETRIED), 64 * MiB)
    assert rt.calls[:4] == [("malloc", 4 * MiB), ("malloc", 8 * MiB), ("free", 8 * MiB), ("malloc", 3 * MiB)]
    assert lp.status[1] == Status.DONE and lp.status[2] == Status.TRIED
    assert lp.addr[2] == lp.addr[1] and lp.handled_ooms == 0
    assert sorted(lp.live.values()) == sorted(rt.held)  # each block once: the attempt's went with its retry


def test_a_served_attempt_nothing_replaced_is_released_at_once(tmp_path: Path) -> None:
    rows = [(Op.MALLOC, 4, 0), (Op.OOM, 16, 1), (Op.MALLOC, 1, 2)]
    lp, rt = _run(_trace(tmp_path, rows), 64 * MiB)
    assert rt.calls == [("malloc", 4 * MiB), ("malloc", 16 * MiB), ("free", 16 * MiB), ("malloc", 1 * MiB)]
    assert lp.status[1] == Status.TRIED and lp.released[1]


class FakePointer:
    """A pool block: the pool takes it back when the last reference goes, as CuPy's does."""

    def __init__(self, rt: FakeRuntime, size: int) -> None:
        self.ptr = rt.malloc(size)  # raises before the block exists: nothing to give back
        self.rt = rt

    def __del__(self) -> None:
        if hasattr(self, "rt"):
            self.rt.free(self.ptr)


def test_the_pool_loop_follows_the_program_too(tmp_path: Path, monkeypatch) -> None:
    """The CuPy pool loop over stand-in ``cupy`` modules (no pool caching: a block goes back when
    dropped): the same three cases as the cudaMalloc loop."""
    import sys
    import types

    from tracekit.device.loops import loop_pool

    rt_mod = types.ModuleType("cupy.cuda.runtime")
    mem_mod = types.ModuleType("cupy.cuda.memory")
    mem_mod.OutOfMemoryError = FakeRuntime.CUDARuntimeError  # type: ignore[attr-defined]
    rt_mod.CUDARuntimeError = FakeRuntime.CUDARuntimeError  # type: ignore[attr-defined]
    cuda = types.ModuleType("cupy.cuda")
    cuda.runtime, cuda.memory = rt_mod, mem_mod  # type: ignore[attr-defined]
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda  # type: ignore[attr-defined]
    for name, mod in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.runtime", rt_mod),
                      ("cupy.cuda.memory", mem_mod)):
        monkeypatch.setitem(sys.modules, name, mod)

    def run(rows: list[tuple[Op, int, int]], cap: int) -> tuple[Loop, FakeRuntime]:
        trace = _trace(tmp_path, rows)
        rt = FakeRuntime(cap)
        rt_mod.memGetInfo = rt.memGetInfo  # type: ignore[attr-defined]
        backend = types.SimpleNamespace(pool=types.SimpleNamespace(malloc=lambda s: FakePointer(rt, s)),
                                        stats=lambda: {})
        lp = Loop(len(trace.events), False, None, Held(), Attempts.of(trace, False))
        ev = trace.events
        loop_pool(lp, ev.op.astype(np.int64), ev.size.astype(np.int64), trace.mate.astype(np.int64),
                  ev.stream, backend, {})  # type: ignore[arg-type]
        return lp, rt

    lp, rt = run(RETRIED, 10 * MiB)
    assert lp.handled_ooms == 1 and lp.first_oom == 5
    lp, rt = run(RETRIED, 64 * MiB)
    assert rt.calls[:4] == [("malloc", 4 * MiB), ("malloc", 8 * MiB), ("free", 8 * MiB), ("malloc", 3 * MiB)]
    assert lp.status[2] == Status.TRIED and lp.addr[2] == lp.addr[1]
    lp, rt = run([(Op.MALLOC, 4, 0), (Op.OOM, 16, 1), (Op.MALLOC, 1, 2)], 64 * MiB)
    assert rt.calls == [("malloc", 4 * MiB), ("malloc", 16 * MiB), ("free", 16 * MiB), ("malloc", 1 * MiB)]
    assert lp.status[1] == Status.TRIED
