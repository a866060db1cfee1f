"""Ending the process without Python's teardown, after runs of tracekit's own code only.

At exit the interpreter unloads every module; once numba has loaded compiled kernels and
matplotlib has drawn, that takes 0.3-0.5 s on the 2-core development machine (2026-12-01:
0.28 s after reading a trace, 0.46-0.54 s after a report), as long as many verbs' whole work
on the committed traces. A verb that ran only tracekit's own code, every output written and
closed through ``tracekit.outputs``, calls ``skip_teardown()``; the console entry point then
flushes stdout and stderr and ends the process with its exit code (``os._exit``). Verbs that
run a user's program (``record``), hold a GPU (``--device``, ``budget``) or a Ray session do
not call it: their libraries' exit handlers run as usual. Only the console entry point acts on
it, so in-process callers (the library, tests through typer's CliRunner) are never ended.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

_STATE: dict[str, Any] = {"skip": False, "console": None}  # console: the entry point's announced()


def skip_teardown() -> None:
    """Mark this run as safe to end without the interpreter's teardown (see the module docstring);
    from the console, also arm ``tracekit.cli.watchdog`` (a signal ends the run within seconds)."""
    _STATE["skip"] = True
    if _STATE["console"] is not None:
        from tracekit.cli.watchdog import arm

        arm(_STATE["console"])


def end_now_if_marked(code: object) -> None:
    """End the process at once with ``code`` (SystemExit's) if the run was marked; else return."""
    if not _STATE["skip"]:
        return
    status = code if isinstance(code, int) else (0 if code is None else 1)
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the descriptor closed (a daemon, cron)
            continue
        # A closed pipe (`| head`) or a closed stream: nothing left to keep.
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)
