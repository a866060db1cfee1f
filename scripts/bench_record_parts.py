"""Where the recorder's overhead goes: the CuPy MLP of ``bench_record_overhead.py`` under hooks built
up piece by piece, in one process, interleaved, min and median of the repeats.

Variants (each a ``MemoryHook`` registered around the timed loop):

- ``none``, ``noop``: no hook; CuPy's own no-op ``MemoryHook``.
- ``c_ignore``: the compiled hook's no-op as all six callbacks: what being called by CuPy costs.
- ``c_list_capsule``: ``c_list`` with CuPy's C stream function, as the recorder has it.
- ``c_list``: the compiled callbacks (``fastpath.Hook``, no call-sites) appending to a bare
  ``EventBuffer`` that is never trimmed (the rows grow for the whole run).
- ``c_list_conststream``: the same with a constant stream (no ``get_current_stream`` per event).
- ``c_list_trim``: ``c_list`` trimmed every ``--trim-rows`` rows into nothing (the rows deleted).
- ``c_ring``: ``c_list`` with every row also into a shared ring (``record.tail``), never trimmed.
- ``rec_no_sites``, ``rec_sites``, ``rec_stacks``: the whole recording (``CupyRecording``).

Also a loop of direct calls of each callable the hooks use (µs per call) and the events per run,
so each difference reads as µs per event.

    PYTHONPATH=. python3 scripts/bench_record_parts.py [--steps 600] [--repeats 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cupy as cp

from tracekit.record import CupyRecording
from tracekit.record import hook as hook_mod
from tracekit.record.callstacks import DEFAULT_DEPTH
from tracekit.record.fastpath import Hook as _MaybeHook
from tracekit.record.hook import ROW, EventBuffer, stream_capsule
from tracekit.record.tail import Tail

if _MaybeHook is None:
    sys.exit("bench_record_parts.py: the compiled helper is not built (python3 setup.py build_ext --inplace)")
Hook = _MaybeHook
HERE = Path(__file__).resolve().parent
TMP = Path(tempfile.mkdtemp(prefix="tk-parts-"))


def _mlp() -> Callable[[int], float]:
    spec = importlib.util.spec_from_file_location("record_workloads", HERE / "record_workloads.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_mlp  # type: ignore[no-any-return]


class _Const:
    ptr = 0


def _registered(hook: Any, ignore_only: bool = False) -> Any:
    """A CuPy ``MemoryHook`` whose six callbacks are the compiled hook's, or its no-op for all six
    (``ignore_only``: what being called by CuPy costs)."""
    class Parts(cp.cuda.MemoryHook):  # type: ignore[misc]
        name = "parts"

    h = Parts()
    if ignore_only:
        h.malloc_postprocess = h.free_postprocess = hook.ignore
    else:
        h.malloc_postprocess, h.free_postprocess = hook.malloc_postprocess, hook.free_postprocess
    h.malloc_preprocess = h.free_preprocess = h.alloc_preprocess = h.alloc_postprocess = hook.ignore
    return h


@contextlib.contextmanager
def c_hook(stream: Callable[[], Any], trim_rows: int = 0, ring: bool = False, ignore_only: bool = False,
           capsule: bool = False) -> Iterator[EventBuffer]:
    buf = EventBuffer()
    tail = None
    if ring:
        tail = Tail.open(TMP / "parts.tail", 2 * 65536)
        assert tail is not None
        buf.mirror(tail.ring)
    if trim_rows:
        def drain() -> None:
            buf.written = len(buf.rows)
        buf.attach(trim_rows * ROW, 10**15, drain)
    hook = Hook(buf, stream, lambda *a: None, clock=None, stream_ptr=stream_capsule(cp) if capsule else None)
    with _registered(hook, ignore_only):
        yield buf
    if tail is not None:
        tail.remove()


RESOLVES = [0]  # the compiled hook's Python slow-path calls (``--count-resolves``)


def count_resolves() -> None:
    """Wrap the compiled hook's slow paths (``hook._stack_resolver``, ``_site_resolver``) so every
    call is counted: a window the hot table answers costs no Python; a miss costs microseconds."""
    for name in ("_stack_resolver", "_site_resolver"):
        make = getattr(hook_mod, name)

        def counted(*a: Any, _make: Callable[..., Any] = make) -> Callable[..., Any]:
            inner = _make(*a)

            def resolve(*args: Any) -> Any:
                RESOLVES[0] += 1
                return inner(*args)
            return resolve
        setattr(hook_mod, name, counted)


@contextlib.contextmanager
def recording(variant: str, rep: int) -> Iterator[None]:
    out = TMP / f"{variant}-{rep}.parquet"
    rec = CupyRecording(out, command=["bench"], sites=variant != "rec_no_sites", force=True,
                        stack_depth=DEFAULT_DEPTH if variant == "rec_stacks" else 0)
    rec.start()
    try:
        yield
    finally:
        rec.stop({"code": 0})
        out.unlink(missing_ok=True)


def variants(trim_rows: int) -> dict[str, Callable[[int], contextlib.AbstractContextManager[Any]]]:
    stream = cp.cuda.get_current_stream
    return {
        "none": lambda rep: contextlib.nullcontext(),
        "noop": lambda rep: cp.cuda.MemoryHook(),
        "c_ignore": lambda rep: c_hook(stream, ignore_only=True),
        "c_list": lambda rep: c_hook(stream),
        "c_list_capsule": lambda rep: c_hook(stream, capsule=True),
        "c_list_conststream": lambda rep: c_hook(lambda: _Const),
        "c_list_trim": lambda rep: c_hook(stream, trim_rows=trim_rows),
        "c_ring": lambda rep: c_hook(stream, ring=True),
        "rec_no_sites": lambda rep: recording("rec_no_sites", rep),
        "rec_sites": lambda rep: recording("rec_sites", rep),
        "rec_stacks": lambda rep: recording("rec_stacks", rep),
    }


def per_call(n: int = 200_000) -> dict[str, float]:
    """µs per call of the pieces a compiled hook calls per event, outside any hook."""
    stream = cp.cuda.get_current_stream
    buf = EventBuffer()
    hook = Hook(buf, stream, lambda *a: None, clock=None)
    kw = {"device_id": 0, "size": 4096, "mem_size": 4096, "mem_ptr": 1 << 40, "pmem_id": 12345}
    fkw = {"device_id": 0, "mem_size": 4096, "mem_ptr": 1 << 40, "pmem_id": 12345}
    out: dict[str, float] = {}

    def loop(name: str, fn: Callable[[], Any]) -> None:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
    loop("empty_lambda", lambda: None)
    loop("get_current_stream", stream)
    loop("get_current_stream_ptr", lambda: stream().ptr)
    loop("getDevice", cp.cuda.runtime.getDevice)
    loop("perf_counter_ns", time.perf_counter_ns)
    loop("c_malloc_postprocess", lambda: hook.malloc_postprocess(**kw))
    del buf.rows[:]
    loop("c_free_postprocess", lambda: hook.free_postprocess(**fkw))
    del buf.rows[:]
    fast = Hook(buf, stream, lambda *a: None, clock=None, stream_ptr=stream_capsule(cp))
    loop("c_malloc_postprocess_capsule_stream", lambda: fast.malloc_postprocess(**kw))
    del buf.rows[:]
    loop("c_free_postprocess_capsule_stream", lambda: fast.free_postprocess(**fkw))
    del buf.rows[:]
    noop = cp.cuda.MemoryHook()
    loop("py_noop_malloc_postprocess", lambda: noop.malloc_postprocess(**kw))
    for k in out:
        if k != "empty_lambda":
            out[k] -= out["empty_lambda"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--trim-rows", type=int, default=2048)
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--count-resolves", action="store_true",
                    help="count the compiled hook's Python slow-path calls in each timed loop")
    args = ap.parse_args()
    if args.count_resolves:
        count_resolves()
    mlp = _mlp()
    mlp(args.warmup)
    table = variants(args.trim_rows)
    if args.only:
        table = {k: v for k, v in table.items() if k in args.only.split(",")}
    times: dict[str, list[float]] = {k: [] for k in table}
    events: dict[str, int] = {}
    resolves: dict[str, list[int]] = {k: [] for k in table}
    for rep in range(args.repeats):
        for name, make in table.items():
            with make(rep) as buf:
                mlp(args.warmup)
                cp.cuda.Device().synchronize()
                n0 = len(buf.rows) if isinstance(buf, EventBuffer) else 0
                r0 = RESOLVES[0]
                t0 = time.perf_counter()
                mlp(args.steps)
                cp.cuda.Device().synchronize()
                times[name].append(time.perf_counter() - t0)
                resolves[name].append(RESOLVES[0] - r0)
                if name == "c_list":  # never trimmed: its rows are the run's events
                    events[name] = (len(buf.rows) - n0) // ROW
    lo = {k: min(v) for k, v in times.items()}
    mid = {k: statistics.median(v) for k, v in times.items()}
    n_ev = max(events.values()) if events else 0
    result = {
        "machine": platform.node(), "gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cp.__version__, "python": platform.python_version(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "steps": args.steps, "repeats": args.repeats, "events_per_run": n_ev,
        "seconds_min": lo, "seconds_median": mid, "seconds_all": times,
        "ratio_to_noop_min": {k: v / lo["noop"] for k, v in lo.items()} if "noop" in lo else {},
        "ratio_to_noop_median": {k: v / mid["noop"] for k, v in mid.items()} if "noop" in mid else {},
        "us_per_event_over_noop_min": ({k: (v - lo["noop"]) / n_ev * 1e6 for k, v in lo.items()}
                                       if n_ev and "noop" in lo else {}),
        "us_per_call": per_call(),
        "resolves_per_run": resolves if args.count_resolves else None,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
