"""The hook driven the way CuPy drives it: keyword callbacks, from any thread, with failures.

No GPU is needed: CuPy calls ``malloc_postprocess(device_id=, size=,
mem_size=, mem_ptr=, pmem_id=)`` and ``free_postprocess(device_id=,
mem_size=, mem_ptr=, pmem_id=)`` on the registered hook (see
cupy/cuda/memory.pyx), and these tests make the same calls with values like
CuPy's (512-rounded sizes, device pointers, ``mem_ptr=0`` when the pool
raises out-of-memory inside the ``finally`` that runs the callbacks).
"""

from __future__ import annotations

import sys
import threading
import types
from pathlib import Path

import numpy as np

from tracekit.record.device_alloc import HookedSegments
from tracekit.record.hook import EventBuffer, TraceHook, unpack
from tracekit.record.session import patch_threads
from tracekit.record.sites import SiteTable
from tracekit.trace import Op

BASE = 0x7F3A_0000_0000
STREAM = types.SimpleNamespace(ptr=0x55D0_1234_5600)


def _stream() -> types.SimpleNamespace:
    return STREAM


def _hook(sites: bool = True, **kw):  # type: ignore[no-untyped-def]
    buf = EventBuffer()
    table = SiteTable(kw.pop("skip", ())) if sites else None
    return buf, table, TraceHook(buf, sites=table, current_stream=_stream, **kw)


def _malloc(hook: TraceHook, size: int, ptr: int, device: int = 0) -> None:
    # CuPy's order: malloc_preprocess, then malloc_postprocess
    rounded = (size + 511) // 512 * 512
    hook.malloc_preprocess(device_id=device, size=size, mem_size=rounded)  # type: ignore[misc]
    hook.malloc_postprocess(device_id=device, size=size, mem_size=rounded, mem_ptr=ptr,  # type: ignore[misc]
                            pmem_id=id(hook) + ptr)


line_malloc = _malloc.__code__.co_firstlineno + 4  # the malloc_postprocess call above


def _free(hook: TraceHook, size: int, ptr: int, device: int = 0) -> None:
    rounded = (size + 511) // 512 * 512
    hook.free_preprocess(device_id=device, mem_size=rounded, mem_ptr=ptr, pmem_id=1)  # type: ignore[misc]
    hook.free_postprocess(device_id=device, mem_size=rounded, mem_ptr=ptr, pmem_id=1)  # type: ignore[misc]


def test_malloc_and_free_rows_carry_sizes_pointer_stream_device_and_site() -> None:
    buf, table, hook = _hook()
    _malloc(hook, 1000, BASE, device=1)
    _free(hook, 1000, BASE, device=1)
    c = unpack(buf.take())
    assert c["op"].tolist() == [Op.MALLOC, Op.FREE]
    assert c["size"].tolist() == [1000, 1024] and c["rounded"].tolist()[0] == 1024
    assert c["addr"].tolist() == [BASE, BASE]
    assert c["stream"].tolist() == [STREAM.ptr] * 2 and c["device"].tolist() == [1, 1]
    assert (np.diff(c["t"]) >= 0).all()
    # the site is the helper that called the hook (the innermost frame outside skipped dirs);
    # frees carry none (their block's malloc has it)
    assert table is not None and c["site"][1] == -1
    assert table.names[c["site"][0]] == f"{Path(__file__)}:{line_malloc}:_malloc"


def test_frames_in_skipped_library_folders_are_not_sites(tmp_path: Path) -> None:
    lib = tmp_path / "fakelib"
    lib.mkdir()
    (lib / "creation.py").write_text(
        "def zeros(hook, n, ptr):\n"
        "    hook.malloc_postprocess(device_id=0, size=n, mem_size=n, mem_ptr=ptr, pmem_id=7)\n"
        "def ones(hook, n, ptr):\n"
        "    return zeros(hook, n, ptr)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        import fakelib.creation as creation  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    buf, table, hook = _hook(skip=(str(lib),))
    line = sys._getframe().f_lineno + 1
    creation.zeros(hook, 512, BASE)
    creation.zeros(hook, 512, BASE + 512)  # a different line: a second site
    c = unpack(buf.take())
    assert table is not None
    assert table.names[c["site"][0]].endswith(f"test_record_hook.py:{line}:"
                                              "test_frames_in_skipped_library_folders_are_not_sites")
    assert table.names[c["site"][1]].endswith(f":{line + 1}:"
                                              "test_frames_in_skipped_library_folders_are_not_sites")
    # a repeated line is served from the cache and gets the same id
    for _ in range(3):
        creation.zeros(hook, 512, BASE)
    assert len(set(unpack(buf.take())["site"].tolist())) == 1 and len(table.names) == 3
    # two library frames deep, twice from the same line and once from another
    line = sys._getframe().f_lineno + 2
    for _ in range(2):
        creation.ones(hook, 512, BASE)
    creation.ones(hook, 512, BASE)
    got = [table.names[s] for s in unpack(buf.take())["site"]]
    assert [n.split(":")[-2] for n in got] == [str(line), str(line), str(line + 1)]


def test_no_sites_mode_records_minus_one() -> None:
    buf, table, hook = _hook(sites=False)
    _malloc(hook, 4096, BASE)
    assert table is None and unpack(buf.take())["site"].tolist() == [-1]


class OomError(MemoryError):
    """Stands in for cupy.cuda.memory.OutOfMemoryError (a MemoryError with a __dict__)."""


def test_failed_malloc_under_out_of_memory_is_an_oom_row_with_the_measured_device() -> None:
    counters = {"used_bytes": 3 << 20, "total_bytes": 8 << 20, "free_bytes": 5 << 20, "limit_bytes": 8 << 20}
    measured = {"device": 0, "mem_free": 117 << 20, "mem_total": 140 << 30, "processes": [],
                "limits": {"stack_size": 16384}, "pool": counters}
    buf, _, hook = _hook(oom_state=lambda device_id: (2, measured))
    msg = "Out of memory allocating 4,194,304 bytes (allocated so far: 8,388,608 bytes)."
    try:  # CuPy runs the callbacks in a ``finally`` while the exception propagates
        raise OomError(msg)
    except MemoryError as e:
        hook.malloc_postprocess(device_id=0, size=4_000_000, mem_size=4_000_256,  # type: ignore[misc]
                                mem_ptr=0, pmem_id=0)
        raised = e
    c = unpack(buf.take())
    assert c["op"].tolist() == [Op.OOM, 15]  # the oom row and its note row
    assert c["size"][0] == 4_000_000 and c["rounded"][0] == 4_000_256
    assert c["device_free"][0] == 117 << 20 and c["pool"][0] == 2 and c["device_free"][1] == -1
    note = buf.notes[int(c["addr"][1])]
    assert note["message"] == msg and note["exception"] == "OomError"
    assert note["free_bytes"] == 5 << 20 and note["size"] == 4_000_000 and note["limit"] == 8 << 20
    assert note["state"] == measured and note["pool_id"] == 2
    # the exception carries the note's index, so the recording can tell which OOM ended the program
    assert raised._tracekit_oom_note == note["note"] == int(c["addr"][1])  # type: ignore[attr-defined]


def test_on_several_devices_a_malloc_takes_the_current_device_and_counts_cupys_wrong_id() -> None:
    """CuPy 14 reports the device that was current when the pool was first used (0 here)."""
    current = [1]
    buf, _, hook = _hook(current_device=lambda: current[0])
    _malloc(hook, 1000, BASE, device=0)  # CuPy says 0 for device 1's pool
    current[0] = 0
    _malloc(hook, 1000, BASE + 512, device=0)  # right
    _free(hook, 1000, BASE, device=1)  # frees carry the block's own device: taken as is
    c = unpack(buf.take())
    assert c["device"].tolist() == [1, 0, 1] and hook.mismatches == [0]
    assert (c["pool"] == -1).all()  # mallocs' pools are resolved from segments later


def test_zero_size_and_non_memory_errors_are_not_ooms() -> None:
    buf, _, hook = _hook()
    hook.malloc_postprocess(device_id=0, size=0, mem_size=0, mem_ptr=0, pmem_id=0)  # type: ignore[misc]
    try:
        raise RuntimeError("cudaErrorIllegalAddress")
    except RuntimeError:
        hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=0, pmem_id=0)  # type: ignore[misc]
    assert len(buf.take()) == 0 and buf.notes == {}


def test_hooked_segments_log_allocations_and_find_the_ends_cupy_does_not_show() -> None:
    buf = EventBuffer()
    live: set[int] = set()
    total = {"pool": 0}  # what the pool's total_bytes() says (CuPy counts a request before making it)
    pool = object()
    made = iter(range(1, 100))
    free_now = iter([900 << 20, 901 << 20, 902 << 20, 903 << 20])
    log = HookedSegments(buf, pool_of=lambda d: (3, pool), alive=lambda p: p in live,
                         total_of=lambda p, d: total["pool"], current_stream=_stream,
                         free_bytes=lambda d: next(free_now))

    def cupy_alloc(size: int, ok: bool = True) -> int:
        total["pool"] += size
        log.before_alloc(0, size)
        ptr = BASE + (next(made) << 24) if ok else 0
        if ok:
            live.add(ptr)
        else:
            total["pool"] -= size
        log.after_alloc(0, size, ptr)
        return ptr

    a = cupy_alloc(2 << 20)
    b = cupy_alloc(4 << 20)
    cupy_alloc(1 << 30, ok=False)  # a failed device allocation: counted, no row
    live.discard(a)  # free_all_blocks: no hook fires
    total["pool"] -= 2 << 20
    c = cupy_alloc(8 << 20)  # asks the pool first: the freed segment ends before the new one
    col = unpack(buf.take())
    assert col["op"].tolist() == [Op.SEGMENT_ALLOC, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.SEGMENT_ALLOC]
    assert col["addr"].tolist() == [a, b, a, c]
    assert col["size"].tolist() == [2 << 20, 4 << 20, 2 << 20, 8 << 20]
    assert log.failures == 1 and log.devices == {0} and log.probes == 2  # a and b, once
    # device-level rows carry their pool and the device's free bytes measured right after
    assert col["pool"].tolist() == [3] * 4 and col["device_free"].tolist() == [900 << 20, 901 << 20,
                                                                               902 << 20, 903 << 20]
    log.before_alloc(0, 0)  # the pool's total agrees now: nothing is probed
    assert log.probes == 2
    live.clear()  # the pool died
    log.sweep({})  # a pool it cannot ask: every live segment is probed
    assert unpack(buf.take())["op"].tolist() == [Op.SEGMENT_FREE] * 2 and log.live == {}


def test_worker_threads_get_the_hook_and_rows_never_tear() -> None:
    """CuPy's registry is per thread: patch_threads installs the hook in each new thread."""
    registry = threading.local()  # stands in for CuPy's thread-local hook registry
    buf, table, hook = _hook()
    registry.hooks = [hook]

    def dispatch_malloc(size: int, ptr: int) -> None:  # what CuPy's pool does per request
        for h in getattr(registry, "hooks", []):
            h.malloc_postprocess(device_id=0, size=size, mem_size=size, mem_ptr=ptr, pmem_id=ptr)

    def worker(k: int) -> None:
        for i in range(2000):
            dispatch_malloc(512 * (k + 1), BASE + (k << 32) + i * 512)

    undo = patch_threads(lambda: setattr(registry, "hooks", [hook]))
    try:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        worker(4)  # the main thread at the same time
        for t in threads:
            t.join()
    finally:
        undo()
    assert threading.Thread._bootstrap_inner.__name__ == "_bootstrap_inner"  # type: ignore[attr-defined]
    c = unpack(buf.take())
    assert len(c["op"]) == 5 * 2000
    k = (c["addr"] - BASE) >> 32
    assert (c["size"] == 512 * (k + 1)).all()  # every row is whole: size matches its thread's pointer
    # dispatch_malloc stands in for CuPy's pool, whose Cython code leaves no Python frame
    assert table is not None
    assert {table.names[s].rsplit(".", 1)[-1] for s in c["site"]} == {"dispatch_malloc"}
    # a thread started after undo gets nothing
    t = threading.Thread(target=lambda: dispatch_malloc(512, BASE))
    t.start()
    t.join()
    assert len(buf.take()) == 0


def test_take_is_safe_while_another_thread_appends() -> None:
    buf, _, hook = _hook(sites=False)
    stop = threading.Event()

    def spin() -> None:
        i = 0
        while not stop.is_set():
            _malloc(hook, 512, BASE + i * 512)
            i += 1

    t = threading.Thread(target=spin)
    t.start()
    got = []
    for _ in range(50):
        got.append(buf.take())
    stop.set()
    t.join()
    got.append(buf.take())
    addr = np.concatenate([unpack(g)["addr"] for g in got])
    assert len(addr) == buf.taken and (np.diff(addr) == 512).all()  # nothing lost or duplicated


def test_device_limits_come_from_the_budget_and_are_read_only_when_it_failed() -> None:
    from tracekit.record.meta import device_limits

    class Runtime:
        def __init__(self) -> None:
            self.calls: list[int] = []

        def deviceGetLimit(self, code: int) -> int:
            self.calls.append(code)
            if code == 1:
                raise RuntimeError("cudaErrorUnsupportedLimit")
            return 100 + code

    from tracekit.budget.measure import unmeasured_budget

    rt = Runtime()
    limits = {"stack_size": 1024, "printf_fifo_size": 1 << 20, "malloc_heap_size": 8 << 20}
    budget = unmeasured_budget(0) | limits  # type: ignore[operator]
    assert device_limits(rt, budget) == limits and rt.calls == []
    assert device_limits(rt, None) == {"stack_size": 100, "printf_fifo_size": None, "malloc_heap_size": 102}
    # a budget that measured one limit and not the others: those are read now
    one = unmeasured_budget(0) | {"stack_size": 2048}  # type: ignore[operator]
    assert device_limits(rt, one) == {"stack_size": 2048, "printf_fifo_size": None, "malloc_heap_size": 102}
