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

import signal
from contextlib import AbstractContextManager

from tracekit.interrupts import quiet, restore_in_child, sigterm_raises

__all__ = ["Terminated", "quiet_signals", "restore_in_child", "stop_signals"]


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives during a recording.

    Not ``errors.Interrupted`` (a KeyboardInterrupt, tracekit's own stop): the recorded
    program's ``except KeyboardInterrupt`` or ``except Exception`` must not swallow a launcher's
    SIGTERM, which without tracekit would have ended it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


def stop_signals() -> AbstractContextManager[None]:
    """SIGTERM raises ``Terminated`` inside the block (``interrupts.sigterm_raises``)."""
    return sigterm_raises(Terminated)


def quiet_signals() -> AbstractContextManager[list[int]]:
    """SIGTERM and SIGINT are noted, not acted on, inside the block (``interrupts.quiet``)."""
    return quiet()
