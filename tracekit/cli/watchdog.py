"""A signal always ends a verb: SIGINT or SIGTERM ends the process within ``GRACE_S`` seconds.

Python runs signal handlers in the main thread, between bytecodes. Native code that does not return
(seen, rarely, inside pyarrow's Parquet writer after a signal under load; cause not found) would keep the
process alive past Ctrl-C. Python's C-level handler still writes the signal number to the wakeup
descriptor; a daemon thread reads it, leaves the normal path ``GRACE_S`` seconds (the verb's
``finally`` blocks, its one line, its exit code), and only if the process is still running then
removes the temporary outputs (``tracekit.outputs.cleanup``), prints the one line unless it was
printed, and ends the process with 130 (SIGINT) or 143 (SIGTERM). Armed by the console entry
point only, for verbs that run tracekit's own code (``quick_exit.skip_teardown``): never in a
user's program under ``record``, nor in-process callers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

GRACE_S = 10.0
_ARMED = {"on": False}


def arm(announced: Callable[[], bool]) -> None:
    """Start the watchdog (main thread only; once); ``announced``: the verb printed its line."""
    if _ARMED["on"] or threading.current_thread() is not threading.main_thread():
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return
    _ARMED["on"] = True
    threading.Thread(target=_watch, args=(r, announced), daemon=True, name="tracekit-watchdog").start()


def _watch(r: int, announced: Callable[[], bool]) -> None:
    while True:
        data = os.read(r, 1)
        if not data:
            return
        if data[0] in (signal.SIGINT, signal.SIGTERM):
            break
    time.sleep(GRACE_S)  # the normal path ends the process well before this
    from tracekit.outputs import cleanup

    code = 143 if data[0] == signal.SIGTERM else 130
    with contextlib.suppress(Exception):
        cleanup()
    if not announced():
        with contextlib.suppress(OSError):
            os.write(2, b"tracekit: terminated (SIGTERM)\n" if code == 143 else b"tracekit: interrupted\n")
    os._exit(code)
