"""The spool: batches written while recording, finalized to v1, recovered after SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import InputError, OutputError
from tracekit.record.hook import EventBuffer, TraceHook
from tracekit.record.recover import finalize, recover
from tracekit.record.sites import SiteTable
from tracekit.record.spool import SpoolWriter
from tracekit.record.spool_format import NOTE_ROW, SITE_ROW, SPOOL_KEY, SPOOL_SCHEMA
from tracekit.trace import Op, Source, TraceMeta, read_trace

ROOT = Path(__file__).resolve().parents[2]
BASE = 0x7F00_0000_0000
STREAM = types.SimpleNamespace(ptr=0)


def _writer(tmp: Path, clock=time.perf_counter_ns, **kw):  # type: ignore[no-untyped-def]
    buf, table = EventBuffer(), SiteTable(())
    hook = TraceHook(buf, sites=table, current_stream=lambda: STREAM, clock=clock,
                     oom_state=lambda d: (0, {"device": d, "mem_free": 1 << 30, "pool": {
                         "used_bytes": 512, "total_bytes": 4096, "free_bytes": 3584}}))
    meta = TraceMeta.new(Source.CUPY, command="python app.py")
    w = SpoolWriter(tmp / "t.parquet.spool", meta, buf, table, 0, **kw)
    return w, hook


def _pair(hook: TraceHook, i: int, size: int = 512) -> None:
    hook.malloc_postprocess(device_id=0, size=size, mem_size=size, mem_ptr=BASE + i * 4096,  # type: ignore[misc]
                            pmem_id=i)
    hook.free_postprocess(device_id=0, mem_size=size, mem_ptr=BASE + i * 4096, pmem_id=i)  # type: ignore[misc]


def test_finalize_writes_a_valid_trace_with_sites_and_oom_seq(tmp_path: Path) -> None:
    w, hook = _writer(tmp_path)
    for i in range(10):
        _pair(hook, i)
    w.flush()
    hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=BASE, pmem_id=1)  # type: ignore[misc]
    try:
        raise MemoryError("Out of memory allocating 1,048,576 bytes (allocated so far: 4,096 bytes).")
    except MemoryError:
        hook.malloc_postprocess(device_id=0, size=1 << 20, mem_size=1 << 20, mem_ptr=0,  # type: ignore[misc]
                                pmem_id=0)
    w.close()
    out = finalize(w.path, tmp_path / "t.parquet", {"complete": True})
    t = read_trace(out, strict=True)
    assert len(t.events) == 22 and t.events.seq.tolist() == list(range(22))
    assert t.events.op[-1] == Op.OOM and t.events.op[-2] == Op.MALLOC
    oom = t.meta.extra["ooms"][0]
    assert oom["seq"] == 21 and oom["rounded"] == 1 << 20 and oom["free_bytes"] == 3584
    assert t.meta.extra["oom_states"][0]["seq"] == 21 and t.meta.extra["oom_states"][0]["mem_free"] == 1 << 30
    assert t.meta.extra["complete"] is True and t.meta.command == "python app.py"
    assert all(s.endswith(":_pair") or "test_finalize" in s for s in t.events.sites)
    assert (np.diff(t.events.t_ns) >= 0).all()


def test_times_never_decrease_even_if_the_clock_does(tmp_path: Path) -> None:
    ticks = iter([50, 40, 60, 10, 70, 80] * 3)
    w, hook = _writer(tmp_path, clock=lambda: next(ticks))
    for i in range(3):
        _pair(hook, i)
        w.flush()
    w.close()
    t = read_trace(finalize(w.path, tmp_path / "t.parquet", {}))
    assert t.events.t_ns.tolist() == [50, 50, 60, 60, 70, 80]


def test_flusher_writes_when_max_events_are_waiting(tmp_path: Path) -> None:
    w, hook = _writer(tmp_path, interval=60.0, max_events=100)
    w.start()
    for i in range(500):
        _pair(hook, i)
    deadline = time.monotonic() + 5
    while w.events < 900 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.events >= 900  # written by the background thread, long before the 60 s interval
    w.close()


def test_flusher_writes_every_interval(tmp_path: Path) -> None:
    w, hook = _writer(tmp_path, interval=0.1)
    w.start()
    _pair(hook, 0)
    time.sleep(0.5)
    assert w.events == 2
    w.close()


def _batches_of_pairs(w, hook, batches: int, pairs: int) -> None:  # type: ignore[no-untyped-def]
    """``batches`` spool batches of ``pairs`` malloc/free pairs each."""
    for k in range(batches):
        for i in range(pairs):
            _pair(hook, k * pairs + i)
        w.flush()


def test_recover_skips_a_batch_cut_short(tmp_path: Path) -> None:
    w, hook = _writer(tmp_path)
    _batches_of_pairs(w, hook, 3, 100)
    size = w.path.stat().st_size
    os.truncate(w.path, size - 40)  # a kill in the middle of the last batch
    out = recover(w.path)
    assert out == tmp_path / "t.parquet"
    t = read_trace(out, strict=True)
    assert len(t.events) == 400 and t.meta.extra["complete"] is False
    assert t.meta.extra["spool_truncated"] is True
    with pytest.raises(OutputError, match="already exists"):
        recover(w.path)
    assert len(read_trace(recover(w.path, force=True)).events) == 400
    # the trace's own name finds its spool; -o picks another output; the spool is kept
    other = recover(tmp_path / "t.parquet", tmp_path / "other.parquet")
    assert len(read_trace(other).events) == 400 and w.path.exists()


def test_recover_rejects_what_is_not_a_spool(tmp_path: Path) -> None:
    bad = tmp_path / "x.parquet.spool"
    bad.write_bytes(b"not arrow at all")
    with pytest.raises(InputError, match="not a tracekit recording spool"):
        recover(bad)
    r = CliRunner().invoke(app, ["recover", str(bad)])
    assert r.exit_code == 1 and "not a tracekit recording spool" in r.output
    r = CliRunner().invoke(app, ["recover", str(tmp_path / "missing.parquet")])
    assert r.exit_code == 1 and "no spool beside it" in r.output


def test_recover_on_a_finished_trace_says_there_is_no_spool(tmp_path: Path) -> None:
    w, hook = _writer(tmp_path)
    _pair(hook, 0)
    w.close()
    done = finalize(w.path, tmp_path / "t.parquet", {"complete": True})
    w.path.unlink()
    r = CliRunner().invoke(app, ["recover", str(done)])
    assert r.exit_code == 1, r.output
    assert r.output.strip() == (f"tracekit: error: {done}: no spool beside it ({done}.spool); "
                                "nothing to recover")


def _open_on(path: Path) -> int:
    """How many of this process's descriptors name ``path``."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if os.path.realpath(fd) == str(path.resolve()))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd (Linux)")
def test_finalize_closes_every_spool_it_opens_of_either_layout(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    w, hook = _writer(tmp_path)
    _pair(hook, 0)
    w.close()
    assert w.path.read_bytes().startswith(b"TKSPOOL\x04")
    finalize(w.path, tmp_path / "t.parquet", {"complete": True})
    assert _open_on(w.path) == 0
    # an Arrow spool (recorders before version 4) is read through memory maps: each one closed
    from tracekit.trace.schema import META_KEY

    opened = []
    real = pa.memory_map

    def tracked(*a, **kw):  # type: ignore[no-untyped-def]
        opened.append(real(*a, **kw))
        return opened[-1]

    old = tmp_path / "old.parquet.spool"
    schema = SPOOL_SCHEMA.with_metadata({META_KEY: TraceMeta.new(Source.CUPY).to_json().encode(),
                                         SPOOL_KEY: b"1"})
    with pa.OSFile(str(old), "wb") as sink, pa.ipc.new_stream(sink, schema) as s:
        s.write_batch(_spool_batch([(100, Op.MALLOC, 512, None, None)]))
    monkeypatch.setattr(pa, "memory_map", tracked)
    t = read_trace(finalize(old, tmp_path / "old.parquet", {"complete": True}))
    assert len(t.events) == 1 and len(opened) >= 2 and all(m.closed for m in opened)
    assert _open_on(old) == 0


CHILD = textwrap.dedent("""
    import sys, time, types
    from pathlib import Path
    from tracekit.record.hook import EventBuffer, TraceHook
    from tracekit.record.sites import SiteTable
    from tracekit.record.spool import SpoolWriter
    from tracekit.trace import Source, TraceMeta
    buf, table = EventBuffer(), SiteTable(())
    s = types.SimpleNamespace(ptr=0)
    hook = TraceHook(buf, sites=table, current_stream=lambda: s)
    w = SpoolWriter(Path(sys.argv[1]), TraceMeta.new(Source.CUPY), buf, table, time.perf_counter_ns())
    w.start()
    n, last = 0, time.monotonic()
    while True:
        p = 0x7f0000000000 + n * 512
        hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=p, pmem_id=n)
        hook.free_postprocess(device_id=0, mem_size=512, mem_ptr=p, pmem_id=n)
        n += 1
        if n % 200 == 0:
            time.sleep(0.0005)
            if time.monotonic() - last > 0.05:
                print(n, flush=True)
                last = time.monotonic()
""")


def test_sigkill_loses_at_most_the_last_second(tmp_path: Path) -> None:
    spool = tmp_path / "k.parquet.spool"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(spool)], stdout=subprocess.PIPE,
                            text=True, env=env)
    assert proc.stdout is not None
    seen: list[tuple[float, int]] = []
    while not seen or time.monotonic() - seen[0][0] < 2.0:  # run 2 s after the first event
        line = proc.stdout.readline()
        if not line:
            break
        seen.append((time.monotonic(), int(line)))
    killed_at = time.monotonic()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc.stdout.close()  # else its pipe is closed by the collector, with a ResourceWarning in a later test
    assert proc.returncode == -signal.SIGKILL
    # events the child had made more than a second before the kill
    issued = max((n for t, n in seen if t <= killed_at - 1.0), default=0)
    assert issued > 0
    r = CliRunner().invoke(app, ["recover", str(spool)])
    assert r.exit_code == 0, r.output
    assert f"Wrote {tmp_path / 'k.parquet'}" in r.output
    t = read_trace(tmp_path / "k.parquet", strict=True)
    assert t.events.count(Op.MALLOC) >= issued
    assert t.meta.extra["complete"] is False
    info = CliRunner().invoke(app, ["info", str(tmp_path / "k.parquet")])
    assert info.exit_code == 0 and "malloc" in info.output, info.output


def test_stop_keeps_the_events_when_reading_the_pool_fails(tmp_path: Path) -> None:
    """A CUDA error left by the program breaks the pool read: the trace is still written, spool gone."""
    from tracekit.record.session import CupyRecording

    class StickyError(RuntimeError):
        pass

    class Broken(CupyRecording):
        def end_state(self):  # type: ignore[no-untyped-def]
            raise StickyError("cudaErrorIllegalAddress: an illegal memory access was encountered")

    out = tmp_path / "t.parquet"
    rec = Broken(out, command=["python", "app.py"])
    w, hook = _writer(tmp_path)
    for i in range(3):
        _pair(hook, i)
    rec.spool, rec.t0 = w, 0
    rec.hook = types.SimpleNamespace(__exit__=lambda *a: None, mismatches=[])  # type: ignore[assignment]
    rec._unpatch = lambda: None
    rec.buffer = types.SimpleNamespace(before_write=None)  # type: ignore[assignment]
    rec.device_id = 0
    rec.pools = types.SimpleNamespace(  # type: ignore[assignment]
        unpatch=lambda: None, logs=[], metadata=lambda: ([], []), sweep=lambda: None, unrecorded_async=False,
        async_seen=lambda devices: False, segments=types.SimpleNamespace(devices=set()))
    rec.probe = types.SimpleNamespace(close=lambda: None)  # type: ignore[assignment]
    assert rec.stop({"code": 0}) == out
    t = read_trace(out, strict=True)
    assert len(t.events) == 6 and t.meta.extra["pool_end"] is None
    assert t.meta.extra["pool_end_error"].startswith("StickyError: cudaErrorIllegalAddress")
    assert not rec.spool_path.exists()


def _spool_batch(rows: list[tuple[int | None, int, int, int | None, str | None]]) -> pa.RecordBatch:
    """Spool rows (t_ns, op, size, site, text) on device 0, stream 0, at address 0x1000."""
    t, op, size, site, text = zip(*rows, strict=True)
    n = len(rows)
    cols = [list(t), list(op), [0x1000] * n, list(size), list(size), [0] * n, [0] * n, list(site), list(text),
            [-1] * n, [-1] * n]
    return pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, SPOOL_SCHEMA,
                                                                                   strict=True)],
                                      schema=SPOOL_SCHEMA)


def test_a_note_takes_the_time_of_the_event_before_it_across_site_rows_and_batches(tmp_path: Path) -> None:
    from tracekit.trace.schema import META_KEY

    def oom_note(k: int) -> str:
        return json.dumps({"kind": "oom", "note": k, "device": 0, "state": {"device": 0, "mem_free": 1}})

    spool = tmp_path / "t.parquet.spool"
    schema = SPOOL_SCHEMA.with_metadata({META_KEY: TraceMeta.new(Source.CUPY).to_json().encode(),
                                         SPOOL_KEY: b"1"})
    with pa.ipc.new_stream(str(spool), schema) as w:
        w.write_batch(_spool_batch([(100, Op.MALLOC, 512, None, None), (200, Op.OOM, 1 << 20, None, None)]))
        # a new batch opens with a call-site row (no time), then the note about the OOM above
        w.write_batch(_spool_batch([(None, SITE_ROW, 0, 0, "app.py:3:f"),
                                    (None, NOTE_ROW, 0, None, oom_note(0))]))
        # a clock that stepped back (150 is written as 200), then a site row between the OOM and its note
        w.write_batch(_spool_batch([(150, Op.OOM, 1 << 21, 0, None), (None, SITE_ROW, 0, 1, "app.py:4:g"),
                                    (None, NOTE_ROW, 0, None, oom_note(1))]))
    t = read_trace(finalize(spool, tmp_path / "t.parquet", {"complete": True}), strict=True)
    assert t.events.t_ns.tolist() == [100, 200, 200]
    states = t.meta.extra["oom_states"]
    assert [(s["seq"], s["t_ns"]) for s in states] == [(1, 200), (2, 200)]
    assert [int(t.events.t_ns[s["seq"]]) for s in states] == [s["t_ns"] for s in states]


def test_recover_reports_its_batches_forward_to_the_end(tmp_path: Path) -> None:
    from tracekit import progress

    w, hook = _writer(tmp_path)
    _batches_of_pairs(w, hook, 3, 10)
    seen: list[float] = []
    with progress.reporting(lambda d, t: seen.append(d / t)):
        recover(w.path)
    assert seen == sorted(seen) and seen[0] > 1 / 3 and seen[-1] == 1.0


def _stack_spool(tmp_path: Path, rows: list[tuple[int, int, int, int, str | None]],
                 stack: pa.DataType = pa.int32()) -> Path:
    """A spool of frame/stack rows (op, id, addr, size, text) then one malloc row naming stack 1."""
    from tracekit.record.spool_format import STACK_FIELD, WRITE_SCHEMA
    from tracekit.trace.schema import META_KEY

    schema = WRITE_SCHEMA.set(WRITE_SCHEMA.get_field_index(STACK_FIELD.name), pa.field("stack", stack))
    rows = [*rows, (Op.MALLOC, 0, 0x1000, 512, None)]
    op, ids, addr, size, text = zip(*rows, strict=True)
    n = len(rows)
    cols = [[0] * n, list(op), list(addr), list(size), list(size), [0] * n, [0] * n, list(ids), list(text),
            [-1] * n, [-1] * n, [-1] * (n - 1) + [1]]
    batch = pa.RecordBatch.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                                       schema=schema)
    spool = tmp_path / "s.parquet.spool"
    meta = schema.with_metadata({META_KEY: TraceMeta.new(Source.CUPY).to_json().encode(), SPOOL_KEY: b"1"})
    with pa.ipc.new_stream(str(spool), meta) as w:
        w.write_batch(batch)
    return spool


FRAMES = [(-3, 0, 8, 0, '["app.py", "main"]'), (-3, 1, 4, 1, '["cupy/x.py", "empty"]')]


def test_a_spool_s_frames_and_stacks_become_the_trace_s(tmp_path: Path) -> None:
    spool = _stack_spool(tmp_path, [*FRAMES, (-4, 0, 0, 0, None), (-4, 1, 1, 1, None)])
    ev = read_trace(finalize(spool, tmp_path / "t.parquet", {"complete": False}), strict=True).events
    assert ev.stack.tolist() == [1]
    assert [f.label() for f in ev.stacks.frames(1)] == ["cupy/x.py:3:empty", "app.py:7:main"]
    assert [f.kind.name for f in ev.stacks.frames(1)] == ["LIBRARY", "USER"]


@pytest.mark.parametrize("rows,cause", [
    ([(-3, 1, 8, 0, '["a.py", "f"]')], "frame id 1 out of order (next expected 0)"),
    ([(-3, 0, 8, 0, '["a.py"]')], "a frame in the spool is not a [file, function] pair of strings"),
    ([(-3, 0, 8, 0, "{")], "a frame in the spool is not valid JSON"),
    ([(-3, 0, 8, 9, '["a.py", "f"]')], "a frame in the spool has line 7 or kind 9, out of range"),
    ([*FRAMES, (-4, 0, 5, 0, None)], "stack 0 names frame 5 and parent -1"),
    ([*FRAMES, (-4, 0, 0, 1, None)], "stack 0 names frame 0 and parent 0; a stack's frame must be defined"),
    ([*FRAMES, (-4, 2, 0, 0, None)], "stack id 2 out of order (next expected 0)"),
])
def test_a_hostile_frame_or_stack_row_is_refused_in_one_sentence(tmp_path: Path, rows: list[Any],
                                                                  cause: str) -> None:
    spool = _stack_spool(tmp_path, rows)
    with pytest.raises(InputError) as err:
        finalize(spool, tmp_path / "t.parquet", {})
    assert str(err.value).startswith(f"{spool}: ") and cause in str(err.value) and "\n" not in str(err.value)


def test_a_spool_stack_column_of_another_type_is_refused(tmp_path: Path) -> None:
    spool = _stack_spool(tmp_path, FRAMES, stack=pa.int64())
    with pytest.raises(InputError, match=r"not a tracekit recording spool \(column 'stack' is int64, "
                                         r"expected int32\)$"):
        finalize(spool, tmp_path / "t.parquet", {})
