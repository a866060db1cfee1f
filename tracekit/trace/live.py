"""The 512-byte rounding every allocator applies, and the live bytes of a trace after every event.

``UNIT`` = 512 bytes is the granularity every modelled allocator hands out (CuPy's pool, PyTorch's
caching allocator, cudaMalloc's small sizes; docs/trace-format.md: ``rounded`` = ⌈size / 512⌉ x 512).
``round_up(n, step)`` = ⌈n / step⌉ x step, for an int, a NumPy integer or an integer array.

``live_bytes`` is "bytes held by live requests after each event": with a per-row ``cost`` (the
request rounded as the caller's model rounds it), the rows ``counted`` as requests that stay live,
and the ``freed`` rows each releasing the request its ``mate`` names,

    delta[i] = cost[i] if counted[i];  delta[f] = -cost[mate[f]] for each freed f;  live = cumsum(delta)

in int64 bytes, one vector operation per step (no Python object per event). The compiled
kernels (``tracekit.sim``) inline the same rounding: they cannot call Python.
"""

from __future__ import annotations

from typing import Any, TypeVar

import numpy as np

from tracekit.trace.schema import Op

UNIT = 512  # bytes: every allocator's smallest granularity

_N = TypeVar("_N", int, np.integer, np.ndarray)


def round_up(n: _N, step: int = UNIT) -> _N:
    """``n`` rounded up to a multiple of ``step``: ⌈n / step⌉ x step (elementwise over arrays).

    Unsigned NumPy values use ``(n + step - 1) // step x step`` (negating them would wrap);
    everything else ``-(-n // step) x step``, which cannot overflow at the top of int64.
    """
    dtype = getattr(n, "dtype", None)
    if dtype is not None and dtype.kind == "u":
        unsigned: Any = n
        s = np.uint64(step)
        return (unsigned + (s - np.uint64(1))) // s * s  # type: ignore[no-any-return]
    return -(-n // step) * step  # type: ignore[no-any-return]


def paired_frees(op: np.ndarray, mate: np.ndarray) -> np.ndarray:
    """Bool per row: a ``free`` whose request is in the trace (``mate`` >= 0)."""
    return (op == Op.FREE) & (mate >= 0)


def live_bytes(cost: np.ndarray, counted: np.ndarray, freed: np.ndarray, mate: np.ndarray) -> np.ndarray:
    """Bytes held by live ``counted`` requests after every row (int64; see the module docstring)."""
    cost = cost.astype(np.int64, copy=False)
    delta = np.where(counted, cost, 0)
    rows = np.flatnonzero(freed)
    delta[rows] = -cost[mate[rows]]
    return np.cumsum(delta)
