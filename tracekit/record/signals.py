"""A launcher's stop signal ends the recorded program like an exception, so the trace is still written.

Python turns SIGINT into ``KeyboardInterrupt``, but SIGTERM (what torchrun,
Slurm and MPI send to the ranks that did not fail) kills the process before
anything is written. While the program runs, ``stop_signals`` makes SIGTERM
raise ``Terminated`` in the main thread instead: the program's ``finally``
blocks run, the recorder writes the trace, and the process then exits with
128 + the signal number (143), as a shell reports a death by SIGTERM.
``quiet_signals`` holds SIGTERM and SIGINT back while the trace is written,
so a second signal cannot cut the file short. A handler the program installs
itself replaces ours, as it would without tracekit. SIGKILL cannot be caught:
the CuPy spool stays behind for ``tracekit recover``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives during a recording."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


def _in_main() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` inside the block (main thread only; elsewhere nothing changes)."""
    if not _in_main():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def quiet_signals() -> Iterator[list[int]]:
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
    """In a forked child of the recorded program: SIGTERM acts as it would without tracekit (the
    child is no recording of ours and must die of the signal): a handler of tracekit's (this
    module's, or the command line's) becomes the default action; one the program installed stays."""
    if not _in_main():
        return
    current = signal.getsignal(signal.SIGTERM)
    if str(getattr(current, "__module__", "") or "").startswith("tracekit."):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
