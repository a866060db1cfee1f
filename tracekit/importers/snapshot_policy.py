"""The input policy for PyTorch snapshots, applied in one place before and during conversion.

A snapshot is untrusted: the restricted unpickler runs nothing from it, and
this module bounds what the converter does with the objects it gets.
``check_top`` checks the top level (device count, the ``segments`` list and
its fields, ``allocator_settings`` and tracekit's own ``tracekit`` record:
types, integer ranges, finite numbers, nesting depth and cycles) before any
arithmetic. ``check_entries`` refuses a history that lists one entry object
more than once (a pickle can reference one object millions of times from a
few bytes: memory must follow the file's real content). ``check_history``
range-checks the history columns: requests below 2^60 bytes, ranges that do
not wrap past 2^64. ``row_budget`` is the most rows a device's history may
turn into (expandable mappings split into grid cells): 2^20 plus 64 per
history entry. The unpickler itself runs under ``unpickle_memory_cap``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tracekit.errors import InputError

MAX_DEVICE = 32767  # the trace's device column is int16
MAX_BYTES = 1 << 62
MAX_REQUEST = 1 << 60
MAX_DEPTH = 32
ROWS_FREE = 1 << 20
ROWS_PER_ENTRY = 64


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v < hi


def _fail(where: Any, what: str) -> InputError:
    return InputError(f"{where}: not a usable PyTorch snapshot: {what}")


def check_top(segs: list[Any], traces: list[Any], top: dict[str, Any], where: Any) -> None:
    """The top level of a snapshot: see the module docstring."""
    if len(traces) > MAX_DEVICE + 1:
        raise _fail(where, f"{len(traces):,} device histories, more than the {MAX_DEVICE + 1:,} allowed")
    for i, seg in enumerate(segs):
        _check_segment(seg, i, where)
    settings = top.get("allocator_settings")
    if settings is not None:
        check_plain(settings, where, "allocator_settings")
    tk = top.get("tracekit")
    if isinstance(tk, dict):
        check_plain(tk, where, "the 'tracekit' record")
        for key in ("allowed_bytes", "total_bytes", "free_bytes_at_start"):
            v = tk.get(key)
            if v is not None and not _int_in(v, 0, MAX_BYTES):
                raise _fail(where, f"tracekit.{key} is {str(v)[:40]}, not a byte count below 2^62")


def _check_segment(seg: Any, i: int, where: Any) -> None:
    if not isinstance(seg, dict):
        raise _fail(where, f"segment {i} is a {type(seg).__name__}, not a dict")
    dev = seg.get("device", 0) or 0
    if not _int_in(dev, 0, MAX_DEVICE + 1):
        raise _fail(where, f"segment {i} names device {str(dev)[:40]}, not an ordinal 0..{MAX_DEVICE}")
    addr, total = seg.get("address", 0), seg.get("total_size")
    if not _int_in(addr, 0, 1 << 64) or not (total is None or _int_in(total, 0, MAX_BYTES)) \
            or addr + (total or 0) > 1 << 64:
        raise _fail(where, f"segment {i} has address {str(addr)[:40]} and total_size {str(total)[:40]}")
    if not _int_in(seg.get("stream", 0) or 0, 0, 1 << 64):
        raise _fail(where, f"segment {i} has a stream that is not an id below 2^64")
    blocks = seg.get("blocks") or []
    if not isinstance(blocks, list):
        raise _fail(where, f"segment {i} has blocks that are not a list")
    for j, b in enumerate(blocks):
        if not isinstance(b, dict):
            raise _fail(where, f"block {j} of segment {i} is not a dict")
        size, a, req = b.get("size", 0), b.get("address", 0), b.get("requested_size")
        if not (_int_in(size, 0, MAX_BYTES) and _int_in(a, 0, 1 << 64) and a + size <= 1 << 64
                and (req is None or _int_in(req, 0, MAX_REQUEST))):
            raise _fail(where, f"block {j} of segment {i} has an address or size out of range")
        if not isinstance(b.get("state", ""), str):
            raise _fail(where, f"block {j} of segment {i} has a state that is not a string")


def check_plain(value: Any, where: Any, what: str) -> None:
    """Plain data only: str, bool, finite numbers (ints within 64 bits, signed or not: PyTorch
    writes SIZE_MAX for 'unlimited'), None, and lists / dicts of
    these, at most MAX_DEPTH deep and without cycles. Walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    seen: set[int] = set()
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict | list | tuple):
            if depth > MAX_DEPTH or id(v) in seen:
                raise _fail(where, f"{what} is nested more than {MAX_DEPTH} deep or refers to itself")
            seen.add(id(v))
            items = list(v.items()) if isinstance(v, dict) else [(None, x) for x in v]
            for k, x in items:
                if k is not None and not isinstance(k, str | int):
                    raise _fail(where, f"{what} has a key that is not a string")
                stack.append((x, depth + 1))
        elif isinstance(v, float) and not math.isfinite(v):
            raise _fail(where, f"{what} holds {v}, not a finite number")
        elif isinstance(v, int) and not isinstance(v, bool) and not -(1 << 63) <= v < 1 << 64:
            raise _fail(where, f"{what} holds an integer beyond 64 bits")
        elif not isinstance(v, str | int | float | bool | bytes) and v is not None:
            raise _fail(where, f"{what} holds a {type(v).__name__}")


def check_entries(entries: list[Any], device: int, where: Any) -> None:
    """One object per history entry: a repeated reference would multiply memory without content."""
    distinct = len({id(e) for e in entries})
    if distinct != len(entries):
        raise _fail(where, f"device {device}'s history lists {len(entries) - distinct:,} entries that are "
                    "references to an earlier one (a recorded history has none)")


def check_history(action: np.ndarray, addr: np.ndarray, size: np.ndarray, requests: np.ndarray,
                  device: int, where: Any) -> None:
    """Requests below 2^60 bytes, every size below 2^62, no range wrapping past 2^64."""
    if len(size) and int(size.max()) >= MAX_BYTES:
        raise _fail(where, f"device {device}'s history has a size of {int(size.max())} bytes (2^62 or more)")
    big = requests & (size >= MAX_REQUEST)
    if big.any():
        raise _fail(where, f"device {device}'s history requests {int(size[big][0])} bytes (2^60 or more)")
    if np.any(addr > np.uint64((1 << 64) - 1) - size):
        raise _fail(where, f"device {device}'s history has an address range that wraps past 2^64")


def row_budget(entries: int) -> int:
    """The most trace rows one device's history may become."""
    return ROWS_FREE + ROWS_PER_ENTRY * entries
