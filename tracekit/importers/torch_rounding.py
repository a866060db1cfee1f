"""PyTorch's CUDA caching allocator request rounding (``round_size``), vectorised.

``round_size(s)``: below ``kMinBlockSize`` = 512 bytes the result is 512.
Otherwise ``d = divisions[clamp(floor(log2 s) - 20, 0, 15)]`` (the
``roundup_power2_divisions`` setting; 0 = off). If ``d > 1`` and ``s > 512 d``,
a power of two stays as it is and any other size rounds up to a multiple of
``step = 2^floor(log2 s) / 2^floor(log2 d)`` (if that step is 0, to
``2^(floor(log2 s) + 1)``). In every other case ``s`` rounds up to a multiple
of 512. All sizes are bytes. Source: ``c10/cuda/CUDACachingAllocator.cpp``
(``round_size``, ``roundup_power2_next_division``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tracekit.inputs import optional_int

MIN_BLOCK = 512
INTERVALS = 16
MAX_DIVISIONS = 1 << 32  # far above any setting PyTorch accepts; keeps the rounding arithmetic small


def divisions_from_settings(settings: Mapping[str, Any] | None) -> np.ndarray:
    """The 16 ``roundup_power2_divisions`` of a snapshot's ``allocator_settings`` (zeros if absent).

    The snapshot stores them as a dict keyed by interval start in MB (``'1'`` ..
    ``'32768'``); interval i covers sizes in [2^i MB, 2^(i+1) MB), the first one
    also everything below 1 MB and the last everything above.
    A value that is not a whole number in 1 .. 2^32 (a string of text, a fraction, a negative)
    leaves its interval off, as PyTorch itself would not round there.
    """
    out = np.zeros(INTERVALS, dtype=np.uint64)
    raw = (settings or {}).get("roundup_power2_divisions")
    if isinstance(raw, Mapping):
        for k, v in raw.items():
            mb, d = optional_int(k), _division(v)
            if mb is not None and mb > 0 and d:
                out[min(mb.bit_length() - 1, INTERVALS - 1)] = d
    elif isinstance(raw, list | tuple) and len(raw) == INTERVALS:
        out[:] = [_division(v) for v in raw]
    return out


def _division(v: Any) -> int:
    """One interval's divisions, 0 (off) unless a whole number in 1 .. 2^32."""
    d = optional_int(v) if not isinstance(v, float) or v.is_integer() else None
    return d if d is not None and 0 < d <= MAX_DIVISIONS else 0


def round_size(size: np.ndarray, divisions: np.ndarray | None = None) -> np.ndarray:
    """Block bytes the allocator looks for when asked for ``size`` bytes (uint64 in and out)."""
    s = np.asarray(size, dtype=np.uint64)
    out = ((s + np.uint64(MIN_BLOCK - 1)) // np.uint64(MIN_BLOCK)) * np.uint64(MIN_BLOCK)
    out = np.where(s < MIN_BLOCK, np.uint64(MIN_BLOCK), out)
    if divisions is None or not np.any(divisions > 1):
        return out.astype(np.uint64)
    lg = _floor_log2(np.maximum(s, np.uint64(1)))
    idx = np.clip(lg.astype(np.int64) - 20, 0, INTERVALS - 1)
    d = np.asarray(divisions, dtype=np.uint64)[idx]
    use = (s >= MIN_BLOCK) & (d > 1) & (s > np.uint64(MIN_BLOCK) * d)
    if not np.any(use):
        return out.astype(np.uint64)
    su, lgu, du = s[use], lg[use], d[use]
    p2floor = np.left_shift(np.uint64(1), lgu)
    step = np.right_shift(p2floor, _floor_log2(du))
    is_pow2 = su == p2floor
    safe_step = np.maximum(step, np.uint64(1))
    floor = su & ~(safe_step - np.uint64(1))
    up = np.where(floor == su, su, floor + safe_step)
    up = np.where(step == 0, np.left_shift(p2floor, np.uint64(1)), up)
    out[use] = np.where(is_pow2, su, up)
    return out.astype(np.uint64)


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2 x) for uint64 x >= 1, exact (no float rounding near powers of two)."""
    x = np.asarray(x, dtype=np.uint64)
    lg = np.zeros(x.shape, dtype=np.uint64)
    for shift in (32, 16, 8, 4, 2, 1):
        sh = np.uint64(shift)
        big = np.right_shift(x, sh) > 0
        x = np.where(big, np.right_shift(x, sh), x)
        lg = lg + np.where(big, sh, np.uint64(0))
    return lg
