"""A minimal progress bar on stderr for long imports (no dependency, no Python object per event).

Only files above ``LARGE_BYTES`` get a bar: small imports stay silent. The bar
redraws at most every ``interval`` seconds with ``\\r`` on a terminal and as
plain lines every 10 % elsewhere, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

LARGE_BYTES = 64 << 20


class Progress:
    """Report ``done`` out of ``total`` units of one named phase."""

    def __init__(self, label: str, total: int, *, enabled: bool = True, stream: TextIO | None = None,
                 interval: float = 0.5) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self._last = 0.0
        self._last_decile = -1
        self.done = 0

    def advance(self, n: int) -> None:
        self.done += n
        self.update(self.done)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        frac = min(max(done / self.total, 0.0), 1.0)
        if self.tty:
            now = time.monotonic()
            if now - self._last < self.interval and frac < 1.0:
                return
            self._last = now
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label:<12} [{bar:<30}] {frac * 100:5.1f}%")
        else:
            decile = int(frac * 10)
            if decile == self._last_decile:
                return
            self._last_decile = decile
            self.stream.write(f"{self.label}: {decile * 10}%\n")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.update(self.total)
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()
