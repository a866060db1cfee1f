"""Trace format v1: schema, events in memory, reading with validation, writing.

The names below load their module on first use (PEP 562): importing ``tracekit.trace.schema``
alone, as the recorder does inside a recorded program's process, must not load the reader's
numba kernels (numba brings its own LLVM into the program, beside any the program loads).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.trace.events import Events
    from tracekit.trace.reader import Trace, read_meta, read_trace
    from tracekit.trace.schema import DeviceInfo, Op, Source, TraceMeta
    from tracekit.trace.writer import TraceWriter, write_trace

_HOME = {
    "Events": "events", "Trace": "reader", "read_meta": "reader", "read_trace": "reader",
    "DeviceInfo": "schema", "Op": "schema", "Source": "schema", "TraceMeta": "schema",
    "TraceWriter": "writer", "write_trace": "writer",
}

__all__ = [
    "DeviceInfo", "Events", "Op", "Source", "Trace", "TraceMeta", "TraceWriter",
    "read_meta", "read_trace", "write_trace",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'tracekit.trace' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tracekit.trace.{home}"), name)
