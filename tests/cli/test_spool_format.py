"""Spool format 4 (framed raw rows): who writes and deletes rows, and hostile spools refused in
one sentence by ``tracekit recover``."""

from __future__ import annotations

import json
import struct
import threading
import time
import types
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.record.hook import ROW, EventBuffer, TraceHook
from tracekit.record.recover import recover
from tracekit.record.sites import SiteTable
from tracekit.record.spool import SpoolWriter
from tracekit.record.spool_format import END, FRAME, MAGIC, META, ROWS, TEXT
from tracekit.trace import Source, TraceMeta, read_trace

STREAM = types.SimpleNamespace(ptr=0)
BASE = 0x7F00_0000_0000


def _writer(tmp: Path, **kw):  # type: ignore[no-untyped-def]
    buf, table = EventBuffer(), SiteTable(())
    hook = TraceHook(buf, sites=table, current_stream=lambda: STREAM)
    meta = TraceMeta.new(Source.CUPY)
    w = SpoolWriter(tmp / "t.parquet.spool", meta, buf, table, time.perf_counter_ns(), **kw)
    return w, hook, buf


def _malloc(hook: TraceHook, i: int) -> None:
    hook.malloc_postprocess(device_id=0, size=512, mem_size=512, mem_ptr=BASE + i * 512,  # type: ignore[misc]
                            pmem_id=i)


def test_another_thread_writes_rows_but_only_the_program_s_thread_deletes_them(tmp_path: Path) -> None:
    w, hook, buf = _writer(tmp_path, interval=3600.0, max_events=100)
    for i in range(10):
        _malloc(hook, i)
    t = threading.Thread(target=w.flush)  # the spool's own thread after a silence
    t.start()
    t.join()
    assert w.events == 10 and buf.written == len(buf.rows) == 10 * ROW  # written, still held
    for i in range(10, 100):  # the hundredth row reaches the cap: this thread trims
        _malloc(hook, i)
    assert buf.written == 0 and len(buf.rows) == 0 and w.events == 100
    w.close()
    t2 = read_trace(recover(w.path), strict=True)
    assert (t2.events.addr - BASE).tolist() == [i * 512 for i in range(100)]  # each row once, in order


def test_a_write_is_due_after_the_interval_in_the_program_s_thread(tmp_path: Path) -> None:
    w, hook, buf = _writer(tmp_path, interval=0.05)
    _malloc(hook, 0)
    assert w.events == 0
    time.sleep(0.1)
    _malloc(hook, 1)  # due: written by this call, nothing left held
    assert w.events == 2 and not buf.rows
    w.close()


def test_a_trim_inside_a_write_of_the_same_thread_is_skipped(tmp_path: Path) -> None:
    w, hook, buf = _writer(tmp_path, interval=3600.0, max_events=2)
    with buf.lock:
        buf.busy = True  # as in a garbage collection that ran a finalizer in the middle of a write
        for i in range(5):
            _malloc(hook, i)
        assert len(buf.rows) == 5 * ROW and w.events == 0
        buf.busy = False
    _malloc(hook, 5)
    assert w.events == 6 and not buf.rows
    w.close()


def _spool(tmp: Path, *frames: bytes, magic: bytes = MAGIC, t0: object = 0) -> Path:
    head = json.dumps({"meta": json.loads(TraceMeta.new(Source.CUPY).to_json()), "t0_ns": t0}).encode()
    p = tmp / "x.parquet.spool"
    p.write_bytes(magic + FRAME.pack(META, 0, len(head)) + head + b"".join(frames))
    return p


def _frame(tag: bytes, count: int, payload: bytes) -> bytes:
    return FRAME.pack(tag, count, len(payload)) + payload


BIG = b"9" * 25  # an int no id column holds


def _row(t: int, op: int = 0, addr: int = 0x1000, size: int = 512) -> bytes:
    return struct.pack("<8q", t, op, addr, size, size, 0, -1, -1)


def test_a_spool_of_rows_and_names_recovers(tmp_path: Path) -> None:
    text = b'["s", 0, "app.py:3:f"]\n'
    p = _spool(tmp_path, _frame(TEXT, 1, text),
               _frame(ROWS, 2, _row(10, 1 << 32) + _row(20, 1, 0x1000)), _frame(END, 0, b""))
    t = read_trace(recover(p), strict=True)
    assert t.events.op.tolist() == [0, 1] and t.events.sites == ("app.py:3:f",)
    assert t.events.t_ns.tolist() == [10, 20] and "spool_truncated" not in t.meta.extra


@pytest.mark.parametrize("frames, magic, says", [
    ((), b"NOTSPOOL", "not a tracekit recording spool"),
    ((_frame(b"JUNK", 0, b""),), MAGIC, "frame of unknown kind"),
    ((FRAME.pack(ROWS, 1, 1 << 40),), MAGIC, "claims 1,099,511,627,776 bytes"),
    ((_frame(ROWS, 3, _row(1)),), MAGIC, "of 3 rows holds 64 bytes"),
    ((_frame(TEXT, 1, b"{not json\n"),), MAGIC, "a text record in the spool is not valid JSON"),
    ((_frame(TEXT, 1, b'["s", "zero", "x"]\n'),), MAGIC, "is not [kind, id, ...]"),
    ((_frame(TEXT, 1, b'["z", 0, "x"]\n'),), MAGIC, "has kind 'z'"),
    ((_frame(TEXT, 1, b'["f", 0, "a.py", "ten", "f", 0]\n'),), MAGIC, "fields of the wrong kind"),
    ((_frame(META, 0, b"{}"),), MAGIC, "a second metadata frame"),
    ((_frame(TEXT, 1, b'["f", 0, "a.py", ' + BIG + b', "f", 0]\n'),), MAGIC, "fields of the wrong kind"),
    ((_frame(TEXT, 1, b'["s", ' + BIG + b', "x"]\n'),), MAGIC, "is not [kind, id, ...]"),
    ((_frame(ROWS, 1, _row(1, op=9)),), MAGIC, "op code 9"),
    ((_frame(ROWS, 1, _row(1, size=1 << 61)),), MAGIC, "a size beyond any device"),
    ((_frame(ROWS, 1, _row(1, op=15)),), MAGIC, "a note in the spool"),
])
def test_a_hostile_spool_is_refused_in_one_sentence(tmp_path: Path, frames: tuple[bytes, ...], magic: bytes,
                                                    says: str) -> None:
    p = _spool(tmp_path, *frames, magic=magic)
    r = CliRunner().invoke(app, ["recover", str(p)])
    assert r.exit_code == 1, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tracekit: error: {p}: ") and says in lines[0], lines
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("t0", [10 ** 30, -5, True, "0"])
def test_a_start_time_out_of_range_is_refused(tmp_path: Path, t0: object) -> None:
    p = _spool(tmp_path, _frame(ROWS, 1, _row(10)), t0=t0)
    r = CliRunner().invoke(app, ["recover", str(p)])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "t0_ns" in r.output, r.output


def test_a_frame_cut_short_ends_the_spool_there(tmp_path: Path) -> None:
    whole = _frame(ROWS, 1, _row(10))
    p = _spool(tmp_path, whole, _frame(ROWS, 2, _row(20) + _row(30))[:-7])
    t = read_trace(recover(p), strict=True)
    assert t.events.t_ns.tolist() == [10] and t.meta.extra["spool_truncated"] is True
    p2 = _spool(tmp_path, whole, FRAME.pack(ROWS, 1, 64)[:5])
    t2 = read_trace(recover(p2, force=True), strict=True)
    assert len(t2.events) == 1 and t2.meta.extra["spool_truncated"] is True


def test_a_stop_signal_raised_into_a_write_loses_and_repeats_nothing(tmp_path: Path) -> None:
    w, hook, buf = _writer(tmp_path, interval=3600.0)
    for i in range(300):
        _malloc(hook, i)
    real = w._file.write
    calls = []

    def interrupted(data, *, sync=True):  # type: ignore[no-untyped-def]
        calls.append(len(data))
        if len(calls) == 1:
            raise KeyboardInterrupt  # as the stop signal's exception, raised between two bytecodes
        real(data, sync=sync)

    w._file.write = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        w.flush()
    assert buf.written == 0 and not buf.busy and w.events == 0  # nothing counted as written
    for i in range(300, 310):
        _malloc(hook, i)
    w.close()
    t = read_trace(recover(w.path), strict=True)
    assert (t.events.addr - BASE).tolist() == [i * 512 for i in range(310)]
    assert len(t.events.sites) == 1 and t.events.sites[0].endswith(":_malloc")


@pytest.mark.parametrize("junk, says", [
    (_frame(b"JUNK", 0, b"xx"), "at byte 343 (frame 2, after 2 rows): a frame of unknown kind b'JUNK'"),
    (_frame(TEXT, 1, b"{not json\n") + _frame(ROWS, 1, _row(40)),
     "a text record in the spool is not valid JSON"),
    (_frame(ROWS, 1, _row(40, op=9)), "(frame 2, after 2 rows): a spool row has op code 9"),
], ids=["unknown-frame", "bad-text", "bad-row"])
def test_a_spool_written_over_keeps_the_events_before_and_says_where_it_stopped(
        tmp_path: Path, junk: bytes, says: str) -> None:
    """Bytes another writer put over the spool's end (the program, a full disk's garbage): the whole
    frames before them are the trace, the metadata and the command say where and why it stopped."""
    good = _frame(ROWS, 2, _row(10) + _row(20, addr=0x2000))
    p = _spool(tmp_path, good, junk, _frame(ROWS, 1, _row(50)), _frame(END, 0, b""))
    r = CliRunner().invoke(app, ["recover", str(p)])
    assert r.exit_code == 0, r.output
    t = read_trace(tmp_path / "x.parquet", strict=True)
    assert t.events.t_ns.tolist() == [10, 20]  # the prefix, nothing after the damage
    assert says in t.meta.extra["spool_damaged"]
    assert "the spool stops making sense" in r.output and says in r.output
