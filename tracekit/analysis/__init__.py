"""Analysis of a trace: memory timeline, fragmentation, the OOM verdict, leaks.

``analyze_trace(trace)`` returns an ``AnalysisResult`` with a per-event
``timeline`` (Arrow table) and a ``summary``; ``pool_state_at`` rebuilds the
blocks and segments live at any event (for memory maps); ``stack_tree`` the live bytes by
call stack of any set of blocks (``analyze --tree``, ``tracekit.analysis.tree``). The
smallest capacity each simulated allocator needs (what-if) is advise's search:
``tracekit.advise.capacity``.
"""

from tracekit.analysis.analyze import AnalysisResult, analyze_trace
from tracekit.analysis.context import DeviceContext, device_context
from tracekit.analysis.diagnosis import Diagnosis
from tracekit.analysis.leaks import PoolState, SiteBytes, pool_state_at
from tracekit.analysis.summary import OOMReport, Summary
from tracekit.analysis.timeline import COLUMNS as TIMELINE_COLUMNS
from tracekit.analysis.tree import TreeLimits, TreeNode, Trees, stack_tree

__all__ = [
    "TIMELINE_COLUMNS",
    "AnalysisResult",
    "DeviceContext",
    "Diagnosis",
    "OOMReport",
    "PoolState",
    "SiteBytes",
    "Summary",
    "TreeLimits",
    "TreeNode",
    "Trees",
    "analyze_trace",
    "device_context",
    "pool_state_at",
    "stack_tree",
]
