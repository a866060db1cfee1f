"""PyTorch's CUDA caching allocator, its rules described once: rounding, segment sizes, settings.

Every part of tracekit that needs PyTorch's rules reads them here: the snapshot
importer (``round_size`` under a snapshot's divisions), the ``torch`` policy,
analysis (``segment_sizes``), advise and the device replay (``settings``,
``options_from_snapshot``). Sizes are bytes.

``round_size(s)``: below ``kMinBlockSize`` = 512 bytes the result is 512.
Otherwise ``d = divisions[clamp(floor(log2 s) - 20, 0, 15)]`` (the
``roundup_power2_divisions`` setting; 0 = off). If ``d > 1`` and ``s > 512 d``,
a power of two stays as it is and any other size rounds up to a multiple of
``step = 2^floor(log2 s) / 2^floor(log2 d)`` (if that step is 0, to
``2^(floor(log2 s) + 1)``). In every other case ``s`` rounds up to a multiple
of 512. Source: ``c10/cuda/CUDACachingAllocator.cpp`` (``round_size``,
``roundup_power2_next_division``).

``segment_sizes(r)``: the bytes cudaMalloc'd on a miss for a rounded request r:
2 MiB if r <= 1 MiB, 20 MiB if r < 10 MiB, else r rounded up to 2 MiB.

Settings arrive as ``key -> value`` strings (``PYTORCH_CUDA_ALLOC_CONF``
syntax, split by ``tracekit.sim.options.parse_alloc_conf``) and are checked as
``c10/core/AllocatorConfig.cpp`` checks them (``settings``); a snapshot's
``allocator_settings`` become such options (``options_from_snapshot``) or,
for the importer's rounding, a divisions table (``divisions_from_settings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.errors import UsageError
from tracekit.inputs import optional_int

MIN_BLOCK = 512  # kMinBlockSize
MAX_DIVISIONS = 1 << 32  # far above any setting PyTorch accepts; keeps the rounding arithmetic small
MIB = 1 << 20
NO_SPLIT_LIMIT = (1 << 62)  # max_split_size unset (PyTorch: SIZE_MAX)
INTERVALS = 16
# Keys PyTorch accepts that do not change where device memory goes.
_NEUTRAL = {
    "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "pinned_num_register_threads",
    "pinned_use_background_threads", "backend", "graph_capture_record_stream_reuse",
    "per_process_memory_fraction",
}


@dataclass(frozen=True)
class TorchSettings:
    """Allocator settings that shape the replay (bytes unless noted).

    ``release_at_trace_frees``: release cached blocks where the input trace
    shows the program releasing memory (a run of ``segment_free`` rows, e.g.
    ``torch.cuda.empty_cache()``), option ``release_points:trace`` (default) or ``none``.
    """

    max_split_size: int = NO_SPLIT_LIMIT
    max_non_split_rounding: int = 20 * MIB
    roundup_power2_divisions: tuple[int, ...] = (0,) * INTERVALS
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    release_at_trace_frees: bool = True
    recorded_addresses: bool = True


def _int(key: str, value: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise UsageError(f"torch option {key}: expected an integer, got {value!r}") from None
    if not -(1 << 40) < v < 1 << 40:  # MB and division counts: larger would overflow the kernels' int64
        raise UsageError(f"torch option {key}: {v} is out of range")
    return v


def _pow2(key: str, v: int, zero_ok: bool) -> int:
    if (v == 0 and zero_ok) or (v > 0 and v & (v - 1) == 0):
        return v
    raise UsageError(f"torch option {key}: {v} is not a power of two")


def parse_divisions(value: str) -> tuple[int, ...]:
    """``"4"`` or ``"[256:1,512:2,>:8]"`` (keys: interval starts in MB) -> 16 divisions."""
    key = "roundup_power2_divisions"
    v = value.strip()
    if not v.startswith("["):
        return (_pow2(key, _int(key, v), False),) * INTERVALS
    if not v.endswith("]"):
        raise UsageError(f"torch option {key}: missing ']' in {value!r}")
    table = [0] * INTERVALS
    first, last = True, 0
    for item in filter(None, (s.strip() for s in v[1:-1].split(","))):
        bound, sep, div = item.partition(":")
        if not sep:
            raise UsageError(f"torch option {key}: expected size:divisions, got {item!r}")
        d = _pow2(key, _int(key, div.strip()), True)
        if bound.strip() == ">":
            table[last + 1:] = [d] * (INTERVALS - last - 1)
            continue
        mb = _pow2(key, _int(key, bound.strip()), False)
        index = min(mb.bit_length() - 1, INTERVALS - 1)
        if first:
            table[:index] = [d] * index
            first = False
        table[index] = d
        last = index
    return tuple(table)


def _bool(key: str, value: str) -> bool:
    if value in ("True", "true", "1"):
        return True
    if value in ("False", "false", "0"):
        return False
    raise UsageError(f"torch option {key}: expected True or False, got {value!r}")


def settings(options: Mapping[str, str]) -> TorchSettings:
    """Check and convert the policy options; UsageError names a bad key or value."""
    kw: dict[str, object] = {}
    for key, value in options.items():
        if key == "max_split_size_mb":
            mb = _int(key, value)
            if mb <= 20:
                raise UsageError(f"torch option {key}: must be > 20 (MB), got {mb}")
            kw["max_split_size"] = mb * MIB
        elif key == "max_non_split_rounding_mb":
            kw["max_non_split_rounding"] = _int(key, value) * MIB
        elif key == "roundup_power2_divisions":
            kw["roundup_power2_divisions"] = parse_divisions(value)
        elif key == "expandable_segments":
            kw["expandable_segments"] = _bool(key, value)
        elif key == "garbage_collection_threshold":
            try:
                t = float(value)
            except ValueError:
                raise UsageError(f"torch option {key}: expected a number, got {value!r}") from None
            if not 0.0 < t < 1.0:
                raise UsageError(f"torch option {key}: must be between 0 and 1, got {value}")
            kw["garbage_collection_threshold"] = t
        elif key == "release_points":
            if value not in ("trace", "none"):
                raise UsageError(f"torch option {key}: expected 'trace' or 'none', got {value!r}")
            kw["release_at_trace_frees"] = value == "trace"
        elif key == "addresses":
            if value not in ("trace", "invent"):
                raise UsageError(f"torch option {key}: expected 'trace' or 'invent', got {value!r}")
            kw["recorded_addresses"] = value == "trace"
        elif key not in _NEUTRAL:
            raise UsageError(f"unknown torch allocator option {key!r}")
    return TorchSettings(**kw)  # type: ignore[arg-type]


def round_sizes(size: np.ndarray, divisions: tuple[int, ...] = (0,) * INTERVALS) -> np.ndarray:
    """``round_size`` for every element of ``size`` as int64, with a settings' divisions table."""
    return round_size(size, np.asarray(divisions, dtype=np.uint64)).astype(np.int64)


def segment_sizes(rounded: np.ndarray) -> np.ndarray:
    """Bytes cudaMalloc'd on a miss: 2 MiB (<= 1 MiB), 20 MiB (< 10 MiB), else 2 MiB multiples."""
    large = (rounded + 2 * MIB - 1) // (2 * MIB) * (2 * MIB)
    return np.where(rounded <= MIB, 2 * MIB, np.where(rounded < 10 * MIB, 20 * MIB, large))


def options_from_snapshot(allocator_settings: Mapping[str, object]) -> dict[str, str]:
    """Policy options equal to a snapshot's ``allocator_settings`` (as the importer keeps them).

    Only settings that differ from PyTorch's defaults are returned, in the
    string form ``settings`` accepts.
    """
    out: dict[str, str] = {}
    if allocator_settings.get("expandable_segments"):
        out["expandable_segments"] = "True"
    m = allocator_settings.get("max_split_size")
    if isinstance(m, int) and 0 < m < NO_SPLIT_LIMIT:
        out["max_split_size_mb"] = str(m // MIB)
    gc = allocator_settings.get("garbage_collection_threshold")
    if isinstance(gc, int | float) and 0.0 < gc < 1.0:
        out["garbage_collection_threshold"] = repr(float(gc))
    div = allocator_settings.get("roundup_power2_divisions")
    if isinstance(div, Mapping) and any(int(v) > 1 for v in div.values()):
        items = sorted((int(k), int(v)) for k, v in div.items())
        out["roundup_power2_divisions"] = "[" + ",".join(f"{k}:{v}" for k, v in items) + "]"
    return out


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
    """Block bytes the allocator looks for when asked for ``size`` bytes (uint64 in and out).

    The division rule is worked out only for the sizes it can change (above 1,024 bytes: a
    division of 2 or more needs s > 512 d), in uint64 arithmetic that wraps as C's size_t does.
    """
    u = np.uint64
    given = np.asarray(size, dtype=np.uint64)
    s = given.reshape(-1)
    out = (s + u(MIN_BLOCK - 1)) & ~u(MIN_BLOCK - 1)  # a multiple of 512 (MIN_BLOCK is a power of two)
    out[s < MIN_BLOCK] = MIN_BLOCK
    div = np.asarray(divisions if divisions is not None else (), dtype=np.uint64)
    if np.any(div > 1):
        _round_divided(s, div, out)
    return out.reshape(given.shape)


def _round_divided(s: np.ndarray, div: np.ndarray, out: np.ndarray) -> None:
    """``round_size``'s division rule into ``out``, for the sizes of ``s`` (1-D) it applies to."""
    u = np.uint64
    at = np.flatnonzero(s > u(2 * MIN_BLOCK))
    su = s[at]
    lg = _floor_log2(su)
    d = div[np.clip(lg.astype(np.int64) - 20, 0, INTERVALS - 1)]
    use = (d > 1) & (su > u(MIN_BLOCK) * d)
    if not np.any(use):
        return
    at, su, lg, d = at[use], su[use], lg[use], d[use]
    p2floor = np.left_shift(u(1), lg)
    step = np.right_shift(p2floor, _floor_log2(d))
    safe_step = np.maximum(step, u(1))
    floor = su & ~(safe_step - u(1))
    up = np.where(floor == su, su, floor + safe_step)
    up = np.where(step == 0, np.left_shift(p2floor, u(1)), up)
    out[at] = np.where(su == p2floor, su, up)


def _floor_log2(x: np.ndarray) -> np.ndarray:
    """floor(log2 x) for uint64 x >= 1, exact: the exponent of x as a double, less one where the
    conversion rounded x up to the next power of two (it never rounds below one)."""
    x = np.asarray(x, dtype=np.uint64)
    lg = np.frexp(x.astype(np.float64))[1].astype(np.uint64) - np.uint64(1)
    np.minimum(lg, np.uint64(63), out=lg)  # x near 2^64 rounds to 2^64 as a double
    lg -= (np.right_shift(x, lg) == 0).astype(np.uint64)
    return lg
