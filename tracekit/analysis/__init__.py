"""Analysis of a trace: memory timeline, fragmentation, the OOM verdict, leaks.

``analyze_trace(trace)`` returns an ``AnalysisResult`` with a per-event
``timeline`` (Arrow table) and a ``summary``; ``pool_state_at`` rebuilds the
blocks and segments live at any event (for memory maps); ``stack_tree`` the live bytes by
call stack of any set of blocks (``analyze --tree``, ``tracekit.analysis.tree``). The
smallest capacity each simulated allocator needs (what-if) is advise's search:
``tracekit.advise.capacity``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tracekit.analysis.analyze import AnalysisResult, analyze_trace
    from tracekit.analysis.context import DeviceContext, device_context
    from tracekit.analysis.diagnosis import Diagnosis
    from tracekit.analysis.leaks import PoolState, SiteBytes, pool_state_at
    from tracekit.analysis.summary import OOMReport, Summary
    from tracekit.analysis.timeline import COLUMNS as TIMELINE_COLUMNS
    from tracekit.analysis.tree import TreeLimits, TreeNode, Trees, stack_tree

# Each name is imported from its module on first use (PEP 562), so importing one module of this
# package (``tracekit.analysis.output``, which ``analyze`` reads the trace with) loads none of the
# analyzer's kernels before the trace is read (issue 45).
_WHERE: dict[str, tuple[str, str]] = {
    "AnalysisResult": ("analyze", "AnalysisResult"), "analyze_trace": ("analyze", "analyze_trace"),
    "DeviceContext": ("context", "DeviceContext"), "device_context": ("context", "device_context"),
    "Diagnosis": ("diagnosis", "Diagnosis"),
    "PoolState": ("leaks", "PoolState"), "SiteBytes": ("leaks", "SiteBytes"),
    "pool_state_at": ("leaks", "pool_state_at"),
    "OOMReport": ("summary", "OOMReport"), "Summary": ("summary", "Summary"),
    "TIMELINE_COLUMNS": ("timeline", "COLUMNS"),
    "TreeLimits": ("tree", "TreeLimits"), "TreeNode": ("tree", "TreeNode"), "Trees": ("tree", "Trees"),
    "stack_tree": ("tree", "stack_tree"),
}


def __getattr__(name: str) -> Any:
    try:
        module, attr = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    globals()[name] = value
    return value


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
