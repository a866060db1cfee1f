"""Progress of a running replay, reported by policies that run their kernel in chunks.

The caller (the CLI) installs a callback with ``reporting(fn)``; a policy calls
``report(done, total)`` between chunks. Without a callback, ``report`` does
nothing, so library users and policies that run in one piece need not care.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Callback = Callable[[int, int], None]

_CURRENT: ContextVar[Callback | None] = ContextVar("tracekit_sim_progress", default=None)

# Events per kernel call when a policy runs in chunks: large enough that the
# Python round trip is negligible, small enough for a smooth bar.
CHUNK = 1 << 20


def report(done: int, total: int) -> None:
    fn = _CURRENT.get()
    if fn is not None:
        fn(done, total)


def chunks(total: int) -> Iterator[tuple[int, int]]:
    """(lo, hi) bounds covering range(total) in CHUNK pieces; reports each as done."""
    for lo in range(0, total, CHUNK):
        hi = min(total, lo + CHUNK)
        yield lo, hi
        report(hi, total)


@contextmanager
def reporting(fn: Callback | None) -> Iterator[None]:
    token = _CURRENT.set(fn)
    try:
        yield
    finally:
        _CURRENT.reset(token)
