"""Command-line interface: ``app.py`` wires one module per verb.

When this package is imported as the ``tracekit`` command starts, Ctrl-C and
SIGTERM during the imports (before the command's own handling is in place)
end the process with one line and exit 130 / 143, not a traceback.
"""

import os as _os
import signal as _signal
import sys as _sys
import threading as _threading


def _startup_exit(signum: int, frame: object) -> None:
    line = "interrupted" if signum == _signal.SIGINT else "terminated (SIGTERM)"
    _sys.stderr.write(f"tracekit: {line}\n")
    _os._exit(128 + signum)  # nothing is written yet: there is nothing to clean up


def startup_handlers_installed() -> bool:
    """Whether the import-time handlers are the current ones (``app`` replaces them)."""
    return _signal.getsignal(_signal.SIGINT) is _startup_exit


if (_os.path.basename(_sys.argv[0] if _sys.argv else "") in ("tracekit", "-m")
        and _threading.current_thread() is _threading.main_thread()):
    for _s, _default in ((_signal.SIGINT, _signal.default_int_handler), (_signal.SIGTERM, _signal.SIG_DFL)):
        if _signal.getsignal(_s) is _default:  # an ignored signal (a background job) stays ignored
            _signal.signal(_s, _startup_exit)
