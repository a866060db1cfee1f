"""Recording CuPy programs: every pool malloc/free, segment and out-of-memory request, crash-safe.

``record_cupy(target, module=..., output=...)`` runs a program as python
would and writes a v1 trace; ``CupyRecording`` does the same around code in
this process (benchmarks, tests); ``recover`` turns the spool of a killed
recording into a trace. Importing this package does not import CuPy.
"""

from tracekit.record.recover import recover
from tracekit.record.session import CupyRecording, record_cupy

__all__ = ["CupyRecording", "record_cupy", "recover"]
