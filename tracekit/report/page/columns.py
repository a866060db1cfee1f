"""Typed arrays as JSON: little-endian bytes, optionally delta-encoded, deflated, base64.

``column(x, "i32", delta=True)`` stores ``d[0] = x[0]``, ``d[i] = x[i] - x[i-1]``; the page
decodes with a prefix sum in the same dtype (exact for integers up to 2^53 in f64). Deflate
level 1: the slowest part of writing a 10M-event page is compression, and level 1 keeps
most of the gain on these columns (indices ascending by 1, sizes from a few hundred values).
"""

from __future__ import annotations

import base64
import zlib

import numpy as np

from tracekit.report.page.model import Column, Dtype

_NUMPY: dict[str, str] = {"u8": "<u1", "i32": "<i4", "f32": "<f4", "f64": "<f8"}


def column(values: np.ndarray, dtype: Dtype, *, delta: bool = False) -> Column:
    """``values`` as a ``Column`` of ``dtype`` (integers must fit it; i32 is checked)."""
    v = np.asarray(values)
    if delta and len(v):
        v = np.diff(v.astype(np.float64 if dtype == "f64" else np.int64), prepend=0)
    if dtype == "i32" and len(v) and (v.min() < -(1 << 31) or v.max() >= (1 << 31)):
        raise ValueError("column does not fit int32")
    raw = np.ascontiguousarray(v, dtype=_NUMPY[dtype]).tobytes()
    return Column(
        dtype=dtype, n=len(v), delta=bool(delta), z=base64.b64encode(zlib.compress(raw, 1)).decode()
    )


def decode(c: Column) -> np.ndarray:
    """The values of a ``Column`` (what the page computes; used by the tests and the benchmark)."""
    v = np.frombuffer(zlib.decompress(base64.b64decode(c["z"])), dtype=_NUMPY[c["dtype"]])
    if c["delta"]:
        v = np.cumsum(v, dtype=v.dtype)
    return v
