"""Arrow arrays to and from NumPy without pyarrow's pandas shim.

Where pandas is installed, pyarrow imports it the first time a conversion asks whether a value is a
pandas object: ``pa.array`` of anything, ``to_numpy``, ``fill_null``. That costs every verb 0.2 s on
the 2-core machine and 0.6 s on the 16-core host of the device machine (its Python has pandas), in
commands that never touch pandas. These helpers go through Arrow's buffers instead: integers as
NumPy views of the values buffer, booleans unpacked from their bitmaps, arrays made from NumPy
memory with ``Array.from_buffers``. ``tests/cli/test_no_pandas.py`` holds the verbs to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["array_of", "as_numpy", "copy_into", "filled", "floats_of", "numpy_dtype", "strings_of",
           "utf8_lengths", "values_of"]


def numpy_dtype(t: pa.DataType) -> np.dtype:
    """NumPy's dtype for an integer, floating or boolean Arrow type: what ``to_pandas_dtype`` gives,
    without it (pyarrow 25 and earlier import pandas there where it is installed: 294 modules,
    0.12 s before a verb's first read on the 2-core machine, 0.3 s on the device machine's host).
    Other types: pyarrow's own answer."""
    if pa.types.is_integer(t):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    if pa.types.is_floating(t):
        return np.dtype(f"f{t.bit_width // 8}")
    if pa.types.is_boolean(t):
        return np.dtype(np.bool_)
    return np.dtype(t.to_pandas_dtype())


def values_of(chunk: pa.Array) -> np.ndarray:
    """The values of an integer or floating chunk (a null's slot holds whatever it holds), as a
    read-only NumPy view of Arrow's buffer. Not ``to_numpy``: where pandas is installed, pyarrow's
    ``to_numpy`` imports it (0.2 s on the 2-core machine, 0.6 s on the 16-core host), in every verb."""
    dtype = numpy_dtype(chunk.type)
    m, off = len(chunk), chunk.offset
    if m == 0:
        return np.empty(0, dtype)
    view = np.frombuffer(chunk.buffers()[1], dtype, count=off + m)[off:]
    view.flags.writeable = False
    return view


def as_numpy(col: pa.ChunkedArray, filler: int) -> tuple[np.ndarray, np.ndarray | None]:
    """An integer column as one NumPy array of its own type, each null as ``filler``; and, where
    the column has nulls, the bool mask of them (None where it has none).

    One chunk without nulls: Arrow's memory itself (read-only, ``values_of``). Otherwise one copy
    (``copy_into``).
    """
    if not col.null_count and col.num_chunks == 1:
        return values_of(col.chunk(0)), None
    out = np.empty(len(col), numpy_dtype(col.type))
    null = np.zeros(len(col), np.bool_) if col.null_count else None
    copy_into(col, out, null, filler)
    return out, null


def filled(col: pa.ChunkedArray | pa.Array, null: bool | int = 0) -> np.ndarray:
    """An integer or boolean column as NumPy, each null as ``null``, without pyarrow's ``to_numpy``
    (see the module): integers as ``as_numpy`` gives them (no copy for one chunk without nulls),
    booleans unpacked from their bitmaps. Other types go through ``to_numpy``."""
    chunked = _chunked(col)
    if pa.types.is_integer(chunked.type):
        return as_numpy(chunked, int(null))[0]
    if not pa.types.is_boolean(chunked.type):
        return np.asarray(chunked.to_numpy())
    out = np.empty(len(chunked), np.bool_)
    at = 0
    for chunk in chunked.chunks:
        m, off = len(chunk), chunk.offset
        if m:
            validity, values = chunk.buffers()[:2]
            part = out[at:at + m]
            part[:] = _bits(values, off, m)
            if chunk.null_count:
                part[_bits(validity, off, m) == 0] = bool(null)
        at += m
    return out


def floats_of(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An integer or floating column as float64, each null as NaN (what ``to_numpy`` gives)."""
    chunked = _chunked(col)
    if not (pa.types.is_integer(chunked.type) or pa.types.is_floating(chunked.type)):
        return np.asarray(chunked.to_numpy(zero_copy_only=False), np.float64)
    out = np.empty(len(chunked), np.float64)
    at = 0
    for chunk in chunked.chunks:
        m, off = len(chunk), chunk.offset
        if m:
            out[at:at + m] = values_of(chunk)
            if chunk.null_count:
                out[at:at + m][_bits(chunk.buffers()[0], off, m) == 0] = np.nan
        at += m
    return out


def strings_of(values: Sequence[str]) -> pa.Array:
    """A UTF-8 string array of ``values`` (each encodable: the caller replaces lone surrogates)."""
    data = [v.encode("utf-8") for v in values]
    lengths = np.fromiter((len(d) for d in data), np.int64, len(data))
    if lengths.sum() >= 1 << 31:  # past a string array's 32-bit offsets: Arrow's own conversion
        return pa.array(values, type=pa.string())
    offsets = np.zeros(len(data) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:], dtype=np.int32)
    buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))]
    return pa.Array.from_buffers(pa.string(), len(data), buffers)


def _chunked(col: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    return col if isinstance(col, pa.ChunkedArray) else pa.chunked_array([col], type=col.type)


def _bits(buf: pa.Buffer, off: int, m: int) -> np.ndarray:
    """Bits ``off`` to ``off + m`` of an Arrow bitmap, one uint8 (0 or 1) each."""
    return np.unpackbits(np.frombuffer(buf, np.uint8), count=off + m, bitorder="little")[off:]


def array_of(values: np.ndarray, typ: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """An Arrow array of type ``typ`` holding ``values`` (cast to the type's width), ``mask`` True
    where a value is null; no copy where ``values`` is already a C-contiguous array of that width.
    Integer, floating and boolean types; others through ``pa.array``."""
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_boolean(typ)):
        return pa.array(values, type=typ, mask=mask)
    n = len(values)
    if pa.types.is_boolean(typ):
        data = pa.py_buffer(np.packbits(np.asarray(values, np.bool_), bitorder="little"))
    else:
        data = pa.py_buffer(np.ascontiguousarray(values, numpy_dtype(typ)))
    validity = None
    nulls = 0
    if mask is not None and (nulls := int(np.count_nonzero(mask))):
        validity = pa.py_buffer(np.packbits(~np.asarray(mask, np.bool_), bitorder="little"))
    return pa.Array.from_buffers(typ, n, [validity, data], null_count=nulls)


def copy_into(col: pa.ChunkedArray, out: np.ndarray, null: np.ndarray | None, filler: int) -> None:
    """``col`` (an integer column of ``out``'s type) into ``out``, chunk by chunk: the values
    buffer, then ``filler`` and the mask ``null`` through the validity bitmap where a chunk has
    nulls (``null`` is given wherever ``col`` has any)."""
    at = 0
    for chunk in col.chunks:
        m, off = len(chunk), chunk.offset
        if m == 0:
            continue
        if not chunk.null_count:
            out[at:at + m] = values_of(chunk)
        else:
            assert null is not None
            valid = _bits(chunk.buffers()[0], off, m).view(np.bool_)
            np.logical_not(valid, out=null[at:at + m])
            if filler == 0:  # the copy and the nulls' zeros in one pass: x 1 where valid, x 0 where null
                np.multiply(values_of(chunk), valid, out=out[at:at + m])  # (5x np.putmask's speed)
            else:
                out[at:at + m] = values_of(chunk)
                np.putmask(out[at:at + m], null[at:at + m], filler)
        at += m


def utf8_lengths(values: pa.Array) -> np.ndarray:
    """Each string's UTF-8 byte count, from a ``string`` or ``large_string`` array's offsets buffer
    (a null slot counts the bytes its offsets span, 0 as Arrow writes nulls; a Parquet dictionary
    holds none): what ``pyarrow.compute.binary_length`` gives, without importing
    ``pyarrow.compute`` (26-34 ms on the 2-core machine, at a verb's first read: it builds 286
    functions and their docstrings). TypeError for any other type."""
    width: np.dtype[np.signedinteger]
    if pa.types.is_large_string(values.type):
        width = np.dtype(np.int64)
    elif pa.types.is_string(values.type):
        width = np.dtype(np.int32)
    else:
        raise TypeError(f"utf8_lengths: {values.type} is not a string type")
    if not len(values):
        return np.zeros(0, np.int64)
    start = values.offset
    offsets = np.frombuffer(values.buffers()[1], dtype=width, count=start + len(values) + 1)
    return np.diff(offsets[start:]).astype(np.int64, copy=False)
