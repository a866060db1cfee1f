"""Ctrl-C and SIGTERM held back while compiled code runs, and raised where the state is consistent.

Python runs a signal handler between bytecodes. A handler that raises
(Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM) can therefore fire inside the
C glue around a compiled numba kernel (argument unboxing, result boxing,
array allocation) where an exception is not expected, and crash the process.
``deferred()`` installs a handler that only records the signal; the block
polls ``check()`` where it is safe (between kernel chunks, see
``tracekit.progress``) and, at the latest, the signal is raised as
``Interrupted`` when the block ends: exit 130 for SIGINT, 143 for SIGTERM.
A block that ends by raising lets its exception through and forgets a held
signal, so a later block does not raise a stale one. Outside the main thread
(signals cannot be caught there) the block runs as is.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from tracekit.errors import Interrupted

_pending: list[int] = []  # signals received inside the innermost deferred() block
_depth = 0


def check() -> None:
    """Raise the first signal received inside ``deferred()`` (no-op when none)."""
    if _pending:
        signum = _pending[0]
        _pending.clear()
        raise Interrupted(signum)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while the block runs; raise the first one when it ends."""
    global _depth
    if threading.current_thread() is not threading.main_thread() or _depth:
        yield
        return

    def _mark(signum: int, frame: FrameType | None) -> None:
        _pending.append(signum)

    previous: dict[int, Any] = {s: signal.signal(s, _mark) for s in (signal.SIGINT, signal.SIGTERM)}
    _depth += 1
    finished = False
    try:
        yield
        finished = True
    finally:
        _depth -= 1
        for s, h in previous.items():
            signal.signal(s, h)
        if not finished:  # the block's own exception propagates; a held signal must not outlive it
            _pending.clear()
    check()
