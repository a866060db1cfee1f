"""The report: why a run went out of memory, as one self-contained HTML page.

``write_report(trace_path, output)`` is ``tracekit.report.page.write_page``: the page ``tracekit
report`` and ``tracekit analyze --report`` write. The matplotlib figures (``report --png``, ``fleet``)
are ``tracekit.report.build``; matplotlib is imported only when a figure is drawn, never when this
package is imported.
"""

from __future__ import annotations

from tracekit.report.page import write_page as write_report

__all__ = ["write_report"]
