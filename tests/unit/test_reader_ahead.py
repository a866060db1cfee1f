"""The reader's pairing begun during the read (``tracekit.trace.ahead``) gives the reader's answer.

A file read in many windows (row groups of a few rows, ``WINDOW_ROWS`` small) is paired window by
window as it is read; the trace, its issues and warnings, and every error are those of the pass the
reader runs over the whole file once it is read (the pass made ahead switched off). Where the pass
cannot be begun (integer columns of other types than the format's) or fails, the reader's own pass
answers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.errors import TraceFormatError
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace
from tracekit.trace import columns as columns_module
from tracekit.trace.ahead import PairingAhead
from tracekit.trace.writer import TraceWriter


def _write(path: Path, ev: Events, rows_per_group: int) -> Path:
    w = TraceWriter(path, TraceMeta.new(Source.SYNTHETIC), row_group_size=rows_per_group)
    w.write(ev)
    w.close()
    return path


def _random_events(seed: int, n: int) -> Events:
    """Mallocs, frees (most of a live block, some of none: double frees, frees never allocated),
    OOMs, segments, on two devices; some roundings unknown (0)."""
    rng = np.random.default_rng(seed)
    op = rng.choice(np.array([Op.MALLOC, Op.FREE, Op.OOM, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE], np.int8),
                    size=n, p=[0.45, 0.4, 0.03, 0.07, 0.05])
    addr = rng.integers(1, 3000, size=n).astype(np.uint64) << np.uint64(12)
    device = rng.integers(0, 2, size=n).astype(np.int16)
    for i in np.flatnonzero(op == Op.FREE)[::2]:  # frees aimed at recent mallocs: most pair
        back = i - int(rng.integers(1, 30))
        if back >= 0 and op[back] == Op.MALLOC:
            addr[i], device[i] = addr[back], device[back]
    size = rng.integers(1, 1 << 20, size=n).astype(np.uint64)
    rounded = np.where(rng.random(n) < 0.2, 0, (size + np.uint64(511)) // np.uint64(512) * np.uint64(512))
    addr[op == Op.OOM] = 0
    return Events.build(op, size, addr=addr, rounded=rounded.astype(np.uint64), device=device,
                        t_ns=np.arange(n, dtype=np.int64) * 10)


def _read_both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, object, list[bool]]:
    """(the read with the pass made ahead, the read without it, whether the first used it); each a
    trace or the error's sentence."""
    used: list[bool] = []
    real = PairingAhead.result

    def spy(self: PairingAhead, *args: object, **kw: object) -> object:
        out = real(self, *args, **kw)  # type: ignore[arg-type]
        used.append(out is not None)
        return out

    def read() -> object:
        try:
            return read_trace(path)
        except TraceFormatError as e:
            return str(e)

    with monkeypatch.context() as m:
        m.setattr(PairingAhead, "result", spy)
        ahead = read()
    with monkeypatch.context() as m:
        m.setattr(PairingAhead, "result", lambda self, *a, **k: None)
        alone = read()
    return ahead, alone, used


def _same(a: object, b: object) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    for field in ("seq", "t_ns", "op", "addr", "size", "rounded", "stream", "device"):
        assert np.array_equal(getattr(a.events, field), getattr(b.events, field)), field  # type: ignore[attr-defined]
    assert np.array_equal(a.mate, b.mate)  # type: ignore[attr-defined]
    assert a.issues == b.issues and a.warnings == b.warnings and a.dropped == b.dropped  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 600), group=st.sampled_from([7, 50, 1000]))
def test_the_pairing_made_during_the_read_is_the_readers(seed: int, n: int, group: int, tmp_path_factory,
                                                          ) -> None:
    path = _write(tmp_path_factory.mktemp("ahead") / "t.parquet", _random_events(seed, n), group)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(columns_module, "WINDOW_ROWS", 60)  # many windows: each handed over as it is read
        ahead, alone, used = _read_both(path, m)
    _same(ahead, alone)
    assert used == [True] or isinstance(ahead, str)


def test_a_table_that_grows_between_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20,000 blocks live at once (the table starts at 4,096 slots): it grows inside windows.
    k = 20_000
    addr = np.concatenate([np.arange(1, k + 1, dtype=np.uint64) << np.uint64(20)] * 2)
    op = np.concatenate([np.full(k, Op.MALLOC, np.int8), np.full(k, Op.FREE, np.int8)])
    size = np.full(2 * k, 512, np.uint64)
    path = _write(tmp_path / "grow.parquet", Events.build(op, size, addr=addr, rounded=size), 3000)
    monkeypatch.setattr(columns_module, "WINDOW_ROWS", 5000)
    ahead, alone, used = _read_both(path, monkeypatch)
    _same(ahead, alone)
    assert used == [True]
    assert ahead.mate[:k].tolist() == list(range(k, 2 * k))  # type: ignore[attr-defined]


def _rewritten(src: Path, dst: Path, change) -> Path:
    f = pq.ParquetFile(src)
    table = change(f.read())
    pq.write_table(table.replace_schema_metadata(f.schema_arrow.metadata), dst, row_group_size=5)
    return dst


def test_other_integer_types_are_paired_by_the_reader(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "t.parquet", _random_events(3, 200), 50)

    def narrow(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index("seq")
        return t.set_column(i, "seq", t.column("seq").cast(pa.int32()))

    narrowed = _rewritten(path, tmp_path / "int32.parquet", narrow)
    monkeypatch.setattr(columns_module, "WINDOW_ROWS", 10)
    ahead, alone, used = _read_both(narrowed, monkeypatch)
    _same(ahead, alone)
    assert used == [False]  # seq is int32 in the file: converted after the read, so paired then
    _same(ahead, read_trace(path))


def test_an_unknown_op_is_the_readers_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "t.parquet", _random_events(4, 200), 50)

    def unknown(t: pa.Table) -> pa.Table:
        ops = t.column("op").to_pylist()
        ops[123] = "realloc"
        return t.set_column(t.schema.get_field_index("op"), "op", pa.array(ops, pa.string()))

    bad = _rewritten(path, tmp_path / "bad.parquet", unknown)
    monkeypatch.setattr(columns_module, "WINDOW_ROWS", 10)
    ahead, alone, _ = _read_both(bad, monkeypatch)
    assert isinstance(ahead, str) and ahead == alone and "unknown op 'realloc' at seq 123" in ahead


def test_a_pass_that_fails_in_its_thread_leaves_the_pairing_to_the_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracekit.trace import _kernels, readpass

    path = _write(tmp_path / "t.parquet", _random_events(5, 300), 50)
    monkeypatch.setattr(columns_module, "WINDOW_ROWS", 60)
    calls = []

    def fails_once(real):
        def run(self, *args):
            calls.append(1)
            if len(calls) == 2:
                raise MemoryError("in the thread")
            return real(self, *args)
        return run

    for cls in (_kernels.ReadPass, readpass.CReadPass):  # whichever pass this build runs
        monkeypatch.setattr(cls, "run", fails_once(cls.run))
    ahead, alone, used = _read_both(path, monkeypatch)
    _same(ahead, alone)
    assert used[0] is False


def test_a_window_it_cannot_code_leaves_the_pairing_to_the_reader(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracekit.trace.ahead as ahead_module

    path = _write(tmp_path / "t.parquet", _random_events(6, 300), 50)
    monkeypatch.setattr(columns_module, "WINDOW_ROWS", 60)

    def broken(window: object, out: object) -> bool:
        raise IndexError("a dictionary index out of range")

    monkeypatch.setattr(ahead_module, "window_op_codes", broken)
    ahead, alone, used = _read_both(path, monkeypatch)
    _same(ahead, alone)
    assert used == [False]
