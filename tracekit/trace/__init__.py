"""Trace format v1: schema, events in memory, reading with validation, writing."""

from tracekit.trace.events import Events
from tracekit.trace.reader import Trace, read_meta, read_trace
from tracekit.trace.schema import DeviceInfo, Op, Source, TraceMeta
from tracekit.trace.writer import TraceWriter, write_trace

__all__ = [
    "DeviceInfo", "Events", "Op", "Source", "Trace", "TraceMeta", "TraceWriter",
    "read_meta", "read_trace", "write_trace",
]
