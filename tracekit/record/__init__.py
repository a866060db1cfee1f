"""Recording CuPy programs: every pool malloc/free, segment and out-of-memory request, crash-safe.

``record_cupy(target, module=..., output=...)`` runs a program as python
would and writes a v1 trace; ``CupyRecording`` does the same around code in
this process (benchmarks, tests); ``recover`` turns the spool of a killed
recording into a trace. Importing this package imports nothing else (no CuPy, no numba).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.record.recover import recover
    from tracekit.record.session import CupyRecording, record_cupy

__all__ = ["CupyRecording", "record_cupy", "recover"]


def __getattr__(name: str) -> Any:
    """The names above, loaded on first use: ``recover`` (numba, the trace reader) is loaded only
    when a recording ends, never into a recorded program's process before it runs."""
    import importlib

    home = {"recover": "recover", "CupyRecording": "session", "record_cupy": "session"}.get(name)
    if home is None:
        raise AttributeError(f"module 'tracekit.record' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tracekit.record.{home}"), name)
