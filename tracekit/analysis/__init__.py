"""Analysis of a trace: memory timeline, fragmentation, the OOM verdict, leaks, what-if capacity.

``analyze_trace(trace)`` returns an ``AnalysisResult`` with a per-event
``timeline`` (Arrow table) and a ``summary``; ``pool_state_at`` rebuilds the
blocks and segments live at any event (for memory maps); ``whatif`` finds the
smallest capacity each simulated allocator needs for a trace.
"""

from tracekit.analysis.analyze import AnalysisResult, analyze_trace
from tracekit.analysis.context import DeviceContext, device_context
from tracekit.analysis.diagnosis import Diagnosis
from tracekit.analysis.leaks import PoolState, SiteBytes, pool_state_at
from tracekit.analysis.summary import OOMReport, Summary
from tracekit.analysis.timeline import COLUMNS as TIMELINE_COLUMNS
from tracekit.analysis.whatif import PolicyFit, WhatIfResult, whatif

__all__ = [
    "TIMELINE_COLUMNS",
    "AnalysisResult",
    "DeviceContext",
    "Diagnosis",
    "OOMReport",
    "PolicyFit",
    "PoolState",
    "SiteBytes",
    "Summary",
    "WhatIfResult",
    "analyze_trace",
    "device_context",
    "pool_state_at",
    "whatif",
]
