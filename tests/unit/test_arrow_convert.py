"""``tracekit.trace.arrow``: the conversions through Arrow's buffers give what pyarrow's own
``to_numpy``, ``fill_null`` and ``pa.array`` give, for chunked columns with nulls and sliced chunks
(a chunk's offset into its buffers)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.trace.arrow import array_of, copy_into, filled, floats_of, numpy_dtype, strings_of, values_of

TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64()]


@st.composite
def columns(draw: st.DrawFn, boolean: bool = False) -> pa.ChunkedArray:
    typ = pa.bool_() if boolean else draw(st.sampled_from(TYPES))
    top = 1 if boolean else min(int(np.iinfo(typ.to_pandas_dtype()).max), 1000)
    chunks = []
    for _ in range(draw(st.integers(1, 4))):
        values = draw(st.lists(st.one_of(st.none(), st.integers(0, top)), max_size=40))
        arr = pa.array([None if v is None else (bool(v) if boolean else v) for v in values], type=typ)
        lo = draw(st.integers(0, len(values)))
        hi = draw(st.integers(lo, len(values)))
        chunks.append(arr.slice(lo, hi - lo))  # an offset into the buffers, as a read may hand over
    return pa.chunked_array(chunks, type=typ)


@settings(max_examples=150, deadline=None)
@given(columns())
def test_integers_filled_as_fill_null_then_to_numpy(col: pa.ChunkedArray) -> None:
    want = col.fill_null(0).to_numpy()
    got = filled(col, 0)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(floats_of(col), col.to_numpy().astype(np.float64))


@st.composite
def columns_with_values_under_nulls(draw: st.DrawFn) -> pa.ChunkedArray:
    """Integer chunks whose null slots hold values (Arrow leaves a null's slot undefined; a writer
    other than pyarrow may leave anything there), sliced as a read may hand them over."""
    typ = draw(st.sampled_from(TYPES))
    info = np.iinfo(typ.to_pandas_dtype())
    chunks = []
    for _ in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 40))
        values = np.array(draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=n, max_size=n)),
                          typ.to_pandas_dtype())
        valid = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), np.bool_)
        arr = pa.Array.from_buffers(typ, n, [pa.py_buffer(np.packbits(valid, bitorder="little")),
                                             pa.py_buffer(values.tobytes())])
        lo = draw(st.integers(0, n))
        chunks.append(arr.slice(lo, draw(st.integers(0, n - lo))))
    return pa.chunked_array(chunks, type=typ)


@settings(max_examples=150, deadline=None)
@given(columns_with_values_under_nulls(), st.sampled_from([0, 7]))
def test_copy_into_fills_nulls_whatever_their_slots_hold(col: pa.ChunkedArray, filler: int) -> None:
    out = np.full(len(col), 99, col.type.to_pandas_dtype())
    null = np.zeros(len(col), np.bool_)
    copy_into(col, out, null if col.null_count else None, filler)
    np.testing.assert_array_equal(out, col.fill_null(filler).to_numpy())
    np.testing.assert_array_equal(null, col.is_null().to_numpy())


@settings(max_examples=100, deadline=None)
@given(columns(boolean=True), st.booleans())
def test_booleans_filled_as_fill_null_then_to_numpy(col: pa.ChunkedArray, null: bool) -> None:
    want = col.fill_null(null).to_numpy(zero_copy_only=False)
    np.testing.assert_array_equal(filled(col, null), want)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), max_size=50), st.data())
def test_array_of_is_pa_array(values: list[int], data: st.DataObject) -> None:
    arr = np.array(values, np.int64)
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values))), np.bool_)
    assert array_of(arr, pa.int64(), mask=mask).equals(pa.array(arr, type=pa.int64(), mask=mask))
    assert array_of(arr, pa.int64()).equals(pa.array(arr, type=pa.int64()))
    flags = arr % 3 == 0
    assert array_of(flags, pa.bool_()).equals(pa.array(flags, type=pa.bool_()))


def test_values_of_is_a_read_only_view_and_strings_of_is_pa_array() -> None:
    chunk = pa.array(np.arange(10, dtype=np.int64)).slice(3, 4)
    view = values_of(chunk)
    np.testing.assert_array_equal(view, [3, 4, 5, 6])
    assert not view.flags.writeable
    names = ["malloc", "", "µ-site.py:3", "free"]
    assert strings_of(names).equals(pa.array(names, type=pa.string()))


def test_numpy_dtype_is_pyarrows_own_without_pandas() -> None:
    """Every integer, floating and boolean type maps to the dtype pyarrow's ``to_pandas_dtype`` names
    (which pyarrow 25 and earlier answer by importing pandas); another type falls back to it."""
    fixed = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(),
             pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.bool_()]
    for t in fixed:
        assert numpy_dtype(t) == np.dtype(t.to_pandas_dtype()), t
    assert numpy_dtype(pa.timestamp("ns")) == np.dtype(pa.timestamp("ns").to_pandas_dtype())
