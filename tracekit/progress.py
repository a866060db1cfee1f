"""The one progress helper: a bar on stderr, and the callback long computations report to.

``Progress`` draws ``done`` out of ``total`` units of one named phase on
stderr: redrawn with ``\\r`` at most every ``interval`` seconds on a
terminal, as a plain line every 10 % elsewhere, so logs stay short. No Python
object per event: callers report counts. Library code that runs in chunks
(the replay kernels) calls ``report(done, total)`` between chunks, or iterates
``chunks(total)``; the CLI installs a receiver with ``reporting(fn)`` (for
example a ``Progress``, which is callable), and without one ``report`` does
nothing.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TextIO

from tracekit import interrupts

Callback = Callable[[int, int], None]

# Inputs from this size on get a bar by default (smaller ones finish before a bar helps).
LARGE_BYTES = 64 << 20
# Events per kernel call when a computation runs in chunks: large enough that the
# Python round trip is negligible, small enough for a smooth bar and a prompt Ctrl-C.
CHUNK = 1 << 20

_CURRENT: ContextVar[Callback | None] = ContextVar("tracekit_progress", default=None)


class Progress:
    """Report ``done`` out of ``total`` units of one named phase on stderr."""

    def __init__(self, label: str, total: int = 0, *, enabled: bool = True, stream: TextIO | None = None,
                 interval: float = 0.5, min_total: int = 0) -> None:
        self.label = label
        self.total = max(int(total), 1)
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self.min_total = min_total
        self.interval = interval
        self._last = 0.0
        self._last_decile = -1
        self._drawn = False
        self.done = 0

    def __call__(self, done: int, total: int) -> None:
        """A ``report`` receiver: the total is learnt from the reporter."""
        self.total = max(int(total), 1)
        if total < self.min_total:
            return
        self.update(done)

    def advance(self, n: int) -> None:
        self.done += n
        self.update(self.done)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        self._drawn = True
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
        """Finish the bar (a newline on a terminal); nothing if it never drew."""
        if self.enabled and self._drawn:
            self.update(self.total)
            if self.tty:
                self.stream.write("\n")
            self.stream.flush()


def report(done: int, total: int) -> None:
    """Tell the installed receiver (if any) that ``done`` of ``total`` units are finished."""
    fn = _CURRENT.get()
    if fn is not None:
        fn(done, total)


def chunks(total: int) -> Iterator[tuple[int, int]]:
    """(lo, hi) bounds covering range(total) in CHUNK pieces; reports each as done."""
    for lo in range(0, total, CHUNK):
        hi = min(total, lo + CHUNK)
        yield lo, hi
        report(hi, total)
        interrupts.check()  # Ctrl-C held back during the chunk takes effect here


@contextmanager
def part(k: int, n: int) -> Iterator[None]:
    """Reports in the block fill the ``k``-th of ``n`` equal parts of the enclosing receiver's range.

    A verb of several phases (analysis, figures, a search per policy) shows one bar that only
    moves forward: a phase's ``report(done, total)`` becomes ``(k + done/total) / n`` of the whole,
    in thousandths; the part is reported full when the block ends.
    """
    outer = _CURRENT.get()
    if outer is None:
        yield
        return

    def inner(done: int, total: int) -> None:
        outer(k * _PART + done * _PART // max(total, 1), n * _PART)

    token = _CURRENT.set(inner)
    try:
        yield
    finally:
        _CURRENT.reset(token)
    outer((k + 1) * _PART, n * _PART)


_PART = 1000


@contextmanager
def reporting(fn: Callback | None) -> Iterator[None]:
    """Install ``fn`` as the receiver of ``report`` for the ``with`` block."""
    token = _CURRENT.set(fn)
    try:
        yield
    finally:
        _CURRENT.reset(token)
