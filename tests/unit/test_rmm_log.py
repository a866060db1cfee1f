"""``import rmm``'s reader: RMM's log format field by field, malformed lines named, the mapping to rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.errors import InputError
from tracekit.importers.rmm_log import (
    DAY_NS,
    convert,
    default_output,
    device_of,
    import_log,
    read_log,
)
from tracekit.trace import Op, Source
from tracekit.trace.reader import read_trace

HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"


def _log(tmp_path: Path, body: str, name: str = "rmm_log.dev0.csv") -> Path:
    p = tmp_path / name
    p.write_bytes((HEADER + body).encode("utf-8", "surrogateescape"))
    return p


def test_rows_as_rmm_writes_them(tmp_path: Path) -> None:
    # Lines as logging_resource_adaptor writes them: %t,%H:%M:%S.%f, then allocate/free/allocate failure.
    log = _log(tmp_path, "".join([
        "139701,14:02:11.000100,allocate,0x7f3a40000000,1000,0x1\n",
        "139701,14:02:11.000150,allocate,0x7f3a40000400,256,0x55d1c0a0\n",
        "139702,14:02:11.000200,free,0x7f3a40000000,1000,0x1\n",
        "139701,14:02:11.000300,allocate failure,(nil),81604378624,0\n",
    ]))
    trace = read_trace(import_log(log).path)
    ev = trace.events
    assert trace.meta.source == Source.RMM
    assert ev.op.tolist() == [Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM]
    assert ev.addr.tolist()[:3] == [0x7F3A40000000, 0x7F3A40000400, 0x7F3A40000000]
    assert ev.size.tolist() == [1000, 256, 1024, 81604378624]  # a free carries the block's aligned bytes
    assert ev.rounded.tolist()[:2] == [1024, 256] and int(ev.rounded[3]) == 81604378624
    assert ev.stream.tolist() == [1, 0x55D1C0A0, 1, 0]
    assert ev.t_ns.tolist() == [0, 50_000, 100_000, 200_000]
    assert ev.device.tolist() == [0] * 4
    assert trace.extras is not None and trace.extras.column("thread").to_pylist() == [139701, 139701, 139702,
                                                                                     139701]
    assert trace.meta.extra["rmm_import"]["threads"] == 2


def test_the_device_comes_from_the_file_name(tmp_path: Path) -> None:
    assert device_of(Path("run.dev3.csv")) == 3 and device_of(Path("rmm.dev12.log")) == 12
    assert device_of(Path("run.csv")) is None and device_of(Path("dev3.csv")) is None
    log = _log(tmp_path, "1,10:00:00.000001,allocate,0x100,256,0\n", "a.dev2.csv")
    assert read_trace(import_log(log).path).events.device.tolist() == [2]
    assert read_trace(import_log(log, tmp_path / "b.parquet", device=5).path).events.device.tolist() == [5]
    assert default_output(Path("/x/rmm_log.dev0.csv")) == Path("/x/rmm_log.dev0.parquet")


def test_zero_byte_requests_make_no_row(tmp_path: Path) -> None:
    # RMM answers a 0-byte request with nullptr and logs it; freeing nullptr is a no-op.
    log = _log(tmp_path, "1,10:00:00.000001,allocate,(nil),0,0\n1,10:00:00.000002,free,(nil),0,0\n"
                         "1,10:00:00.000003,allocate,0x200,8,0\n")
    res = import_log(log)
    assert res.rows == 1 and res.null_pointer_rows == 2


def test_midnight_and_threads_logging_at_once(tmp_path: Path) -> None:
    log = _log(tmp_path, "1,23:59:59.999990,allocate,0x100,1,0\n"
                         "2,00:00:00.000010,allocate,0x200,1,0\n"  # past midnight: +20 us
                         "1,00:00:00.000005,free,0x100,1,0\n")  # a step back: clamped
    cols = read_log(log)
    c = convert(cols, log, 0)
    assert c.events.t_ns.tolist() == [0, 20_000, 20_000]
    info = c.meta.extra["rmm_import"]
    assert info["midnights"] == 1 and info["time_steps_back"] == 1
    assert DAY_NS == 86_400 * 10**9


@pytest.mark.parametrize("body,line,words", [
    ("1,10:00:00.000001,allocate,0x100,256,0\n1,10:00:00.000002,alloc,0x100,256,0\n", 3,
     "Action field 'alloc'"),
    ("1,10:00:00.000001,allocate,0x100,256\n", 2, "expected the 6 fields"),
    ("1,10:00:00.000001,allocate,0x100,256,0,7\n", 2, "got 7"),
    ("x,10:00:00.000001,allocate,0x100,256,0\n", 2, "Thread field 'x'"),
    ("1,25:00:00.000001,allocate,0x100,256,0\n", 2, "Time field"),
    ("1,10:00:00,allocate,0x100,256,0\n", 2, "Time field"),
    ("1,10:00:00.000001,allocate,0xfg,256,0\n", 2, "Pointer field '0xfg'"),
    ("1,10:00:00.000001,allocate,0x11112222333344445,256,0\n", 2, "Pointer field"),
    ("1,10:00:00.000001,allocate,0x100,-5,0\n", 2, "Size field '-5'"),
    ("1,10:00:00.000001,allocate,0x100,1152921504606846976,0\n", 2, "below 2^60"),
    ("1,10:00:00.000001,allocate,0x100,256,stream\n", 2, "Stream field 'stream'"),
    ("1,10:00:00.000001,allocate,0x100,256,0\n\n", 3, "Thread field ''"),
    ("1,10:00:00.000001,allocate,0x100,256,\udcff\n", 2, "Stream field"),
    ('1,10:00:00.000001,"allocate",0x100,256,0\n', 2, "Action field"),
])
def test_a_malformed_line_is_named(tmp_path: Path, body: str, line: int, words: str) -> None:
    log = _log(tmp_path, body)
    with pytest.raises(InputError) as e:
        import_log(log)
    msg = str(e.value)
    assert msg.startswith(f"{log}: line {line}: ") and words in msg and "\n" not in msg
    assert not (tmp_path / "rmm_log.dev0.parquet").exists()


@pytest.mark.parametrize("text,words", [
    ("", "line 1: not an RMM log"),
    ("Thread,Time,Action,Pointer,Size\n", "line 1: not an RMM log header"),
    ("\xff\xfe,1\n", "line 1: not an RMM log header"),
])
def test_not_a_log_is_refused_at_line_one(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "x.csv"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(InputError, match=words):
        import_log(p)


def test_the_header_alone_is_an_empty_trace(tmp_path: Path) -> None:
    assert import_log(_log(tmp_path, "")).rows == 0


def test_a_bad_line_in_a_later_block_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracekit.importers.rmm_log as m

    monkeypatch.setattr(m, "BLOCK_BYTES", 1 << 10)  # many blocks: the line count carries across them
    good = "".join(f"7,10:00:00.{i:06d},allocate,0x{(i + 1) * 256:x},256,0\n" for i in range(500))
    log = _log(tmp_path, good + "7,10:00:01.000000,allocate,0x1,2x,0\n" + good)
    with pytest.raises(InputError, match=r": line 502: the Size field '2x'"):
        import_log(log)
    log = _log(tmp_path, good + "7,10:00:01.000000,allocate\n" + good, "b.csv")
    with pytest.raises(InputError, match=r": line 502: expected the 6 fields"):
        import_log(log)


_row = st.tuples(
    st.integers(0, 2**63), st.integers(0, DAY_NS // 1000 - 1), st.sampled_from(["allocate", "free"]),
    st.integers(1, 2**48), st.integers(0, 2**40), st.integers(0, 2**48),
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(_row, max_size=40))
def test_every_field_reads_back(tmp_path_factory: pytest.TempPathFactory,
                                rows: list[tuple[int, ...]]) -> None:
    tmp = tmp_path_factory.mktemp("log")
    lines = []
    for th, us, act, ptr, size, stream in rows:
        h, rest = divmod(us, 3600 * 10**6)
        m, rest = divmod(rest, 60 * 10**6)
        s, f = divmod(rest, 10**6)
        lines.append(f"{th},{h:02d}:{m:02d}:{s:02d}.{f:06d},{act},{ptr:#x},{size},{stream:x}\n")
    cols = read_log(_log(tmp, "".join(lines)))
    assert cols.thread.tolist() == [r[0] for r in rows]
    assert cols.t_ns.tolist() == [r[1] * 1000 for r in rows]
    assert cols.action.tolist() == [0 if r[2] == "allocate" else 1 for r in rows]
    assert cols.pointer.tolist() == [r[3] for r in rows]
    assert cols.size.tolist() == [r[4] for r in rows]
    assert cols.stream.tolist() == [r[5] for r in rows]
    assert np.all(np.diff(convert(cols, tmp / "x.csv", 0).events.t_ns) >= 0)
