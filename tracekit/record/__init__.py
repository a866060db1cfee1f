"""Recording programs unmodified: CuPy's allocations (every pool malloc/free, segment, OOM), PyTorch's.

``record_cupy(target, module=..., output=...)`` runs a program as python
would and writes a v1 trace; ``CupyRecording`` does the same around code in
this process (benchmarks, tests); ``recover`` turns the spool of a killed
recording into a trace; ``record_torch`` (``record.torch``) runs a PyTorch
program with its allocation history on and imports the snapshot. Importing
this package imports nothing else (no CuPy, no PyTorch, no numba).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.record.recover import recover
    from tracekit.record.session import CupyRecording, record_cupy
    from tracekit.record.torch import record_torch

__all__ = ["CupyRecording", "record_cupy", "record_torch", "recover"]


def __getattr__(name: str) -> Any:
    """The names above, loaded on first use: ``recover`` (numba, the trace reader) is loaded only
    when a recording ends, never into a recorded program's process before it runs."""
    import importlib

    home = {"recover": "recover", "CupyRecording": "session", "record_cupy": "session",
            "record_torch": "torch"}.get(name)
    if home is None:
        raise AttributeError(f"module 'tracekit.record' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tracekit.record.{home}"), name)
