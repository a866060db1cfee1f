"""PyTorch allocator settings for the ``torch`` policy, and PyTorch's ``round_size``.

Settings arrive as ``key -> value`` strings (PyTorch's ``PYTORCH_CUDA_ALLOC_CONF``
syntax, split by ``tracekit.sim.options.parse_alloc_conf``) and are checked as
``c10/core/AllocatorConfig.cpp`` checks them. ``round_sizes`` is the vectorized
``round_size``: below 512 B -> 512; with d = roundup_power2_divisions for the
size's interval (index floor(log2 s) - 20, clamped to [0, 15]) and d > 1 and
s > 512 d: a power of two stays, else s rounds up to a multiple of
2^floor(log2 s) / d; otherwise s rounds up to a multiple of 512.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tracekit.errors import UsageError
from tracekit.sim.heap import UNIT, round_up

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
    """PyTorch's ``round_size`` for every element of ``size`` (int64 result)."""
    s = size.astype(np.int64)
    out = np.maximum(round_up(s), UNIT)
    div = np.asarray(divisions, dtype=np.int64)
    if len(s) == 0 or div.max() <= 1:
        return out
    log = np.frexp(np.maximum(s, 1).astype(np.float64))[1].astype(np.int64) - 1
    d = div[np.clip(log - 20, 0, INTERVALS - 1)]
    use = (d > 1) & (s > 512 * d)
    floor2 = np.left_shift(np.int64(1), log)
    dlog = np.frexp(np.maximum(d, 1).astype(np.float64))[1].astype(np.int64) - 1
    step = np.right_shift(floor2, dlog)
    safe = np.maximum(step, 1)
    up = np.where(s % safe == 0, s, (s // safe + 1) * safe)
    up = np.where(step == 0, floor2 << 1, up)
    up = np.where(s == floor2, s, up)
    return np.where(use, up, out)


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
