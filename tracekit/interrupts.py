"""tracekit's one signal policy: how SIGINT and SIGTERM stop a verb, a device loop or a recording.

Every verb stops the same way: ``errors.Interrupted`` (a KeyboardInterrupt; exit 130 for SIGINT,
143 for SIGTERM), turned into one line in ``tracekit.cli.app``; the watchdog
(``tracekit.cli.watchdog``) ends a process that native code keeps alive past a signal.

- ``deferred()``: held back while compiled code or a device loop runs (below);
- ``sigterm_raises(make)``: SIGTERM raises ``make(signum)`` in the main thread (the CLI's
  ``Interrupted``; a recording's ``Terminated``, which a recorded program's own
  ``except KeyboardInterrupt`` / ``except Exception`` cannot swallow);
- ``quiet()``: noted, not acted on, while a trace is written;
- ``restore_in_child()``: a forked child of a recorded program dies of SIGTERM as without us.

Ctrl-C and SIGTERM held back while compiled code runs, and raised where the state is consistent.

Python runs a signal handler between bytecodes. A handler that raises
(Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM) can therefore fire inside the
C glue around a compiled numba kernel (argument unboxing, result boxing,
array allocation) where an exception is not expected, and crash the process.
``deferred()`` installs a handler that only records the signal; the block
polls ``check()`` where it is safe (between kernel chunks, see
``tracekit.progress``) and, at the latest, the signal is raised as
``Interrupted`` when the block ends: exit 130 for SIGINT, 143 for SIGTERM.
A block that ends by raising lets its exception through and forgets a held
signal, so a later block does not raise a stale one. A device loop polls the handle the
block yields (``Held.check``) every few hundred requests, where no pointer is in flight.

Outside the main thread (signals cannot be caught there) a block holds nothing back; there
``check()`` raises ``Cancelled`` once the thread's pool has said stop (``stop_when``: set by
``workers.Pool`` for its threads, so advise's and whatif's replays end at the end of their
current replay or chunk after a signal), and ``deferred()`` checks as it ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from types import FrameType
from typing import Any

from tracekit import SIGTERM_AT_START as AT_START  # what the process started with (``as_at_start``)
from tracekit.errors import Interrupted

_pending: list[int] = []  # signals received inside the innermost deferred() block
_depth = 0


_STOP: ContextVar[threading.Event | None] = ContextVar("tracekit_stop", default=None)


class Cancelled(BaseException):
    """A task's thread told to stop (``workers.Pool`` closed its threads, as after a signal): the
    task ends at its next ``check()``. Not an ``Exception``: a task's own ``except Exception``, which
    turns one setting's failure into its answer, lets it through."""


def stop_when(event: threading.Event) -> None:
    """In a task's thread: ``check()`` raises ``Cancelled`` there once ``event`` is set."""
    _STOP.set(event)


def check() -> None:
    """Raise the first signal received inside ``deferred()`` (no-op when none). In any other thread
    than the main one, which a signal never reaches: ``Cancelled`` once its pool says stop
    (``stop_when``), else nothing (a held signal is the main thread's to raise)."""
    if not _in_main():
        stop = _STOP.get()
        if stop is not None and stop.is_set():
            raise Cancelled
        return
    if _pending:
        signum = _pending[0]
        _pending.clear()
        raise Interrupted(signum)


class Held:
    """What a ``deferred()`` block yields: ``check()`` raises a held signal where the caller's state
    is consistent (a device loop between requests)."""

    @property
    def signum(self) -> int:
        """The first signal held (0: none), so a loop can finish its bookkeeping before ``check()``."""
        return _pending[0] if _pending else 0

    @staticmethod
    def check() -> None:
        check()


@contextmanager
def deferred() -> Iterator[Held]:
    """Hold SIGINT/SIGTERM while the block runs; raise the first one (``Interrupted``) when it ends."""
    global _depth
    if not _in_main() or _depth:
        yield Held()
        if not _in_main():
            check()  # a task's thread: its pool may have said stop (a replay ends here)
        return

    def _mark(signum: int, frame: FrameType | None) -> None:
        _pending.append(signum)

    previous: dict[int, Any] = {s: signal.signal(s, _mark) for s in (signal.SIGINT, signal.SIGTERM)}
    _depth += 1
    finished = False
    try:
        yield Held()
        finished = True
    finally:
        _depth -= 1
        for s, h in previous.items():
            signal.signal(s, h)
        if not finished:  # the block's own exception propagates; a held signal must not outlive it
            _pending.clear()
    check()


def _in_main() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_raises(make: Callable[[int], BaseException]) -> Iterator[None]:
    """Inside the block SIGTERM raises ``make(signum)`` (main thread only; elsewhere nothing changes)."""
    if not _in_main():
        yield
        return

    def _raise(signum: int, frame: FrameType | None) -> None:
        raise make(signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def quiet() -> Iterator[list[int]]:
    """SIGTERM and SIGINT are noted, not acted on, inside the block (the list collects them)."""
    got: list[int] = []
    if not _in_main():
        yield got
        return

    def note(signum: int, frame: FrameType | None) -> None:
        got.append(signum)

    saved = [(s, signal.signal(s, note)) for s in (signal.SIGTERM, signal.SIGINT)]
    try:
        yield got
    finally:
        for s, h in saved:
            signal.signal(s, h)


def restore_in_child() -> None:
    """In a forked child of a recorded program: SIGTERM acts as it would without tracekit (the
    child is no recording of ours and must die of the signal): a handler of tracekit's becomes
    the default action; one the program installed stays."""
    if not _in_main():
        return
    current = signal.getsignal(signal.SIGTERM)
    if str(getattr(current, "__module__", "") or "").startswith("tracekit."):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def as_at_start() -> Iterator[None]:
    """Inside the block SIGTERM has the disposition the process started with (``AT_START``: the
    default action, unless the process was started ignoring it): a recorded program dies of it as
    without tracekit (main thread only)."""
    if not _in_main() or AT_START is None:
        yield
        return
    previous = signal.signal(signal.SIGTERM, AT_START)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
