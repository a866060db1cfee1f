"""The reader's one read of all columns (``trace.columns``) and its one compiled pass.

``as_numpy`` gives what Arrow's ``fill_null`` and ``is_null`` give, chunk offsets and all, without
their copies; a read whose one multi-threaded read fails reads column by column and gives the same
trace (and so the same errors, column by column, as before); the one pass finds the first event of
each fault as the separate checks did.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.errors import InputError
from tracekit.trace import Op, columns, reader
from tracekit.trace.arrow import as_numpy, utf8_lengths
from tracekit.trace.columns import Columns
from tracekit.trace.issues import Found
from tracekit.trace.reader import read_trace
from tracekit.trace.validate import pair_and_check, pair_events

ROOT = Path(__file__).resolve().parents[2]


def test_as_numpy_fills_nulls_as_fill_null_does() -> None:
    whole = pa.array([5, None, 7, None, 9, 10, None, 12], pa.uint64())
    empty = pa.array([], pa.uint64())
    col = pa.chunked_array([whole.slice(1, 4), whole.slice(5, 3), empty, whole.slice(0, 1)])
    out, null = as_numpy(col, 3)
    assert out.dtype == np.uint64
    assert out.tolist() == col.fill_null(3).to_numpy().tolist() == [3, 7, 3, 9, 10, 3, 12, 5]
    assert null is not None and null.tolist() == col.is_null().to_numpy(zero_copy_only=False).tolist()
    plain, none = as_numpy(pa.chunked_array([pa.array([1, 2], pa.int16())]), 0)
    assert none is None and plain.dtype == np.int16 and plain.tolist() == [1, 2]


@pytest.mark.parametrize("name", ["cupy-oom-frag", "torch-expandable", "cupy-seed-base"])
def test_a_failed_read_at_once_reads_column_by_column_to_the_same_trace(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ROOT / "traces" / f"{name}.parquet"
    at_once = read_trace(path)

    def fail(self: Columns, names: list[str], numeric: list[str]) -> None:
        raise pa.ArrowInvalid("the read at once fails")

    monkeypatch.setattr(Columns, "_read_all", fail)
    one_by_one = read_trace(path)
    for field in ("seq", "t_ns", "op", "addr", "size", "rounded", "stream", "device", "site", "stack"):
        assert np.array_equal(getattr(at_once.events, field), getattr(one_by_one.events, field)), field
    assert np.array_equal(at_once.mate, one_by_one.mate)
    assert at_once.issues == one_by_one.issues and at_once.warnings == one_by_one.warnings
    assert (at_once.extras is None) == (one_by_one.extras is None)
    if at_once.extras is not None and one_by_one.extras is not None:
        assert at_once.extras.equals(one_by_one.extras)


@pytest.mark.parametrize("name", ["cupy-oom-frag", "torch-expandable", "cupy-seed-base"])
def test_the_copies_give_the_same_columns_on_the_reading_thread_and_in_parallel(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One core copies on the reading thread, several in a thread a column: the same arrays, nulls'
    fillers and masks included."""
    path = ROOT / "traces" / f"{name}.parquet"
    reads = []
    for copiers in (0, 1, 8):
        monkeypatch.setattr(columns, "_copiers", lambda n, k=copiers: min(n, k))
        reads.append(read_trace(path))
    first = reads[0]
    for other in reads[1:]:
        for field in ("seq", "t_ns", "op", "addr", "size", "rounded", "stream", "device", "site"):
            assert np.array_equal(getattr(first.events, field), getattr(other.events, field)), field
        assert np.array_equal(first.mate, other.mate) and first.issues == other.issues


def test_a_read_gives_the_switch_interval_back(tmp_path: Path) -> None:
    """The read hands the GIL round quickly (``reader.quick_switches``) and leaves the process's
    interval as it found it, after a read that fails too."""
    before = sys.getswitchinterval()
    seen: list[float] = []
    read_trace(ROOT / "traces" / "cupy-oom-frag.parquet",
               on_window=lambda w: seen.append(sys.getswitchinterval()))
    assert seen and max(seen) <= reader.READ_SWITCH_S < before
    assert sys.getswitchinterval() == before
    bad = tmp_path / "cut.parquet"
    bad.write_bytes((ROOT / "traces" / "cupy-oom-frag.parquet").read_bytes()[:-100])
    with pytest.raises(InputError):
        read_trace(bad)
    assert sys.getswitchinterval() == before


def test_overlapping_reads_give_the_interval_back_once_the_last_ends() -> None:
    """Reads in two threads, the first ending while the second is under way: the short interval holds
    until the second ends, then the process's own comes back (not the short one the second saw)."""
    import threading

    before = sys.getswitchinterval()
    second_in, first_out, seen = threading.Event(), threading.Event(), []

    def second() -> None:
        with reader.quick_switches():
            second_in.set()
            first_out.wait(5)
            seen.append(sys.getswitchinterval())

    with reader.quick_switches():
        t = threading.Thread(target=second)
        t.start()
        second_in.wait(5)
    first_out.set()
    t.join(5)
    assert seen == [reader.READ_SWITCH_S] and sys.getswitchinterval() == before


def test_the_one_pass_finds_each_fault_at_its_first_event(tmp_path: Path) -> None:
    op = np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.OOM, Op.MALLOC, Op.FREE, Op.FREE], np.int8)
    seq = np.array([1, 2, 2, 4, 5, 6, 3], np.uint64)  # not increasing at rows 2 and 6
    t_ns = np.array([0, 5, 4, 6, 7, 8, 1], np.int64)  # decreasing at rows 2 and 6
    addr = np.array([4096, 8192, 4096, 0, (1 << 64) - 512, 8192, 4096], np.uint64)
    size = np.array([100, 2048, 0, 1 << 60, 1000, 0, 0], np.uint64)  # row 3: a request of 2^60
    rounded = np.array([0, 2048, 0, 0, 1024, 0, 0], np.uint64)  # row 4 runs past 2^64
    device = np.zeros(7, np.int16)
    pairing, found = pair_and_check(op, seq, t_ns, addr, size, rounded, device, 1 << 60, 1 << 62)
    assert found.tolist() == [2, 2, 3, -1, -1, 4] and len(found) == len(Found)
    assert rounded[0] == 100 and rounded[3] == 1 << 60  # unknown roundings: the requested size
    alone = pair_events(op, addr, device, seq, size)
    assert np.array_equal(pairing.mate, alone.mate) and np.array_equal(pairing.keep, alone.keep)
    assert pairing.issues == alone.issues  # the second free of 4096 (row 6): a double free


def test_the_one_pass_stops_the_totals_at_their_first_step_past_the_limit() -> None:
    half = 1 << 61  # two live blocks of 2^61 rounded bytes: live bytes reach 2^62 at the second
    op = np.array([Op.MALLOC, Op.FREE, Op.MALLOC, Op.MALLOC, Op.SEGMENT_ALLOC], np.int8)
    addr = np.array([0, 0, 1 << 20, 1 << 40, 1 << 50], np.uint64)
    size = np.array([1, 0, 1, 1, 1 << 62], np.uint64)
    rounded = np.array([half, 0, half, half, 0], np.uint64)
    seq, t_ns = np.arange(5, dtype=np.uint64), np.zeros(5, np.int64)
    _, found = pair_and_check(op, seq, t_ns, addr, size, rounded, np.zeros(5, np.int16), 1 << 60, 1 << 62)
    assert found[Found.OVER_LIVE] == 3 and found[Found.OVER_RESERVED] == -1


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=40)), max_size=30), st.booleans(),
       st.integers(0, 5), st.integers(0, 5))
def test_call_site_lengths_are_arrows_byte_lengths(texts: list[str | None], large: bool, cut: int,
                                                   keep: int) -> None:
    """The reader's check of call-site sizes reads each string's UTF-8 bytes off the offsets (so it
    need not import pyarrow.compute): the same as Arrow's own ``binary_length``, slices included."""
    import pyarrow.compute as pc

    arr = pa.array(texts, pa.large_string() if large else pa.string())
    arr = arr.slice(min(cut, len(arr)), keep)
    want = [n or 0 for n in pc.binary_length(arr).to_pylist()]
    assert utf8_lengths(arr).tolist() == want
    assert utf8_lengths(pa.array(["ab", "c"], pa.string()).slice(1, 0)).tolist() == []


def test_call_site_lengths_refuse_other_types() -> None:
    for arr in (pa.array([b"ab"], pa.binary()), pa.array([1, 2])):
        with pytest.raises(TypeError, match="not a string type"):
            utf8_lengths(arr)
