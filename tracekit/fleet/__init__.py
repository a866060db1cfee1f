"""Many traces at once: one row per trace, a summary across them, a report, on local processes or Ray.

``run_fleet(paths, FleetOptions(...))`` expands the paths (files, folders,
globs), runs the single-trace engine (``tracekit.analysis.analyze_trace``) on
each trace in a worker (``tracekit.fleet.member``), gathers the small rows
into a polars table (``tracekit.fleet.table``), summarises it (who ran out
of memory and why, imbalance across ranks, the worst trace:
``tracekit.fleet.summary``) and writes the Parquet table and the HTML
report. Engines: ``local`` (a pool of long-lived processes) or ``ray``
(``tracekit.fleet.engines``). See ``docs/fleet.md``.
"""

from tracekit.fleet.engines import Engine
from tracekit.fleet.run import FleetOptions, FleetResult, run_fleet

__all__ = ["Engine", "FleetOptions", "FleetResult", "run_fleet"]
