"""Byte sizes: parsing ``6GiB``/``512MiB``/``1.5GB``/plain bytes, and formatting.

Binary units (KiB, MiB, GiB, TiB) are powers of 1024; decimal units (KB, MB,
GB, TB) are powers of 1000; a bare number is bytes. Formatting always uses
binary units with two decimals, as PyTorch's OOM message does.
"""

from __future__ import annotations

import re

from tracekit.errors import UsageError

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kib": 1024, "kb": 1000,
    "m": 1024**2, "mib": 1024**2, "mb": 1000**2,
    "g": 1024**3, "gib": 1024**3, "gb": 1000**3,
    "t": 1024**4, "tib": 1024**4, "tb": 1000**4,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, what: str = "size") -> int:
    """Parse a human byte size into an int; raise UsageError naming ``what``."""
    m = _SIZE_RE.match(text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise UsageError(
            f"invalid {what} {text!r}: expected bytes or a number with a unit "
            "such as 512MiB, 6GiB or 1.5GB"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if value < 0 or value != value:
        raise UsageError(f"invalid {what} {text!r}: must be non-negative")
    if value >= 2.0**62:  # also inf (1e400): byte counts stay below 2^62 (see the input policy)
        raise UsageError(f"invalid {what} {text!r}: must be below 2^62 bytes (4 EiB)")
    return int(round(value))


def format_size(n: int | float | None) -> str:
    """Format bytes: ``N bytes`` up to 1 KiB, then KiB/MiB/GiB/TiB with 2 decimals."""
    if n is None:
        return "n/a"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n <= 1024:
        return f"{sign}{int(n)} bytes"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.2f} {unit}"
    raise AssertionError("unreachable")
