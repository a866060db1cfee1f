"""The one error hierarchy of tracekit.

Library code raises these and never exits; the CLI turns each into a one-line
message and an exit code in a single place (``tracekit.cli.app``). Usage
errors exit 2, bad input and runtime failures exit 1, and an out-of-memory
verdict requested with ``--fail-on-oom`` exits 3.
"""

from __future__ import annotations


class TracekitError(Exception):
    """Base class: a message meant for the user, and the exit code it maps to."""

    exit_code = 1


class UsageError(TracekitError):
    """The command line itself is wrong (a bad option value, conflicting options)."""

    exit_code = 2


class InputError(TracekitError):
    """An input file is missing, unreadable or not a valid trace / snapshot."""

    exit_code = 1


class TraceFormatError(InputError):
    """A file is readable but breaks the trace format contract (structural fault)."""


class DeviceError(TracekitError):
    """The GPU, its driver or CuPy / PyTorch is missing or failed."""

    exit_code = 1


class OutputError(TracekitError):
    """An output path cannot be written, or writing it would destroy an input."""

    exit_code = 1


class OOMVerdict(TracekitError):
    """A replay ran out of memory and the user asked for that to fail the run."""

    exit_code = 3


class Interrupted(KeyboardInterrupt):
    """A signal asked tracekit to stop: SIGTERM (exit 143), or SIGINT raised as this (exit 130).

    A KeyboardInterrupt, so every ``finally`` and every ``except KeyboardInterrupt``
    that cleans up runs for SIGTERM exactly as for Ctrl-C, and ``except Exception``
    never swallows it. Exit code: 128 + the signal number, as a shell reports it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.exit_code = 128 + signum
