"""tracekit: record, replay and explain GPU out-of-memory errors.

The package is laid out by pipeline stage: ``trace`` (the v1 Parquet format),
``record`` and ``importers`` (producing traces), ``sim`` and ``device``
(replaying them), ``analysis`` (fragmentation, OOM diagnosis, what-if),
``budget`` (device memory before the first allocation), ``report`` (plots)
and ``cli`` (one module per verb).
"""

import signal as _signal
import threading as _threading

__version__ = "0.1.0"

# SIGTERM's disposition before any tracekit code ran (the command line installs its own handlers
# right after this package is imported): what a recorded program has without tracekit
# (``tracekit.interrupts.as_at_start``). Read only in the main thread, where handlers live.
SIGTERM_AT_START = (_signal.getsignal(_signal.SIGTERM)
                    if _threading.current_thread() is _threading.main_thread() else _signal.SIG_DFL)
