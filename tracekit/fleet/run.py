"""``run_fleet``: analyze many traces on an engine and put the rows, the summary and the outputs together.

Order of work: expand the PATH arguments and check every output first (a
typo costs nothing); run one task per trace on the engine, each returning a
``TraceRow``; build the polars table and the summary in the driver (rows
only: the driver never reads a trace); write the Parquet table; for
``--report``, render the worst traces' single-trace figures on the same
engine and write the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import TracekitError
from tracekit.fleet.engines import Engine, default_jobs, open_engine
from tracekit.fleet.inputs import check_outputs, expand_paths, largest_size
from tracekit.fleet.member import MemberOptions, analyze_member, render_member
from tracekit.fleet.row import TraceRow, storable
from tracekit.progress import report as report_progress
from tracekit.trace.stacks import UserCode
from tracekit.workers import cap_workers, peak_bytes

if TYPE_CHECKING:
    from tracekit.fleet.summary import FleetSummary

WORST_DRAWN = 3  # traces drawn with the single-trace figures in the fleet report


@dataclass(frozen=True)
class FleetOptions:
    """How to run a fleet and what to write (paths are checked before any work)."""

    engine: Engine = Engine.LOCAL
    jobs: int | None = None
    address: str | None = None
    whatif: bool = False
    advise: bool = False
    output: Path | None = None
    report: Path | None = None
    force: bool = False  # replace existing output files
    user_code: UserCode = field(default_factory=UserCode)  # what counts as the user's code (``--user-code``)


@dataclass(frozen=True, eq=False)
class FleetResult:
    """The fleet table (a polars DataFrame), its summary, and the files written."""

    table: Any
    summary: FleetSummary  # polars is imported only when a fleet runs (workers never need it)
    written: tuple[Path, ...]


def require_polars() -> None:
    """TracekitError (exit 1) in one sentence unless polars, the ``fleet`` extra, can be imported."""
    import importlib.util

    if importlib.util.find_spec("polars") is None:
        raise TracekitError('tracekit fleet needs polars, which is not installed; install it with: '
                            'pip install -e ".[fleet]"')


def run_fleet(paths: Sequence[str | Path], options: FleetOptions = FleetOptions()) -> FleetResult:
    """Analyze every trace ``paths`` names; see the module docstring."""
    require_polars()
    from tracekit.fleet.summary import summarize, worst_paths
    from tracekit.fleet.table import rows_frame, write_parquet

    members = expand_paths(paths)
    check_outputs(members, ((options.output, "-o"), (options.report, "--report")), force=options.force)
    # One worker per CPU, fewer where the memory the largest member may take (workers.peak_bytes)
    # does not fit that many times; --jobs asks for at most as many.
    jobs = cap_workers(options.jobs or default_jobs(), tasks=len(members),
                       worker_bytes=peak_bytes(largest_size(members)))
    mo = MemberOptions(whatif=options.whatif, advise=options.advise, curve=options.report is not None,
                       user_code=options.user_code)
    written: list[Path] = []
    with open_engine(options.engine, jobs, options.address) as runner:
        rows: list[TraceRow | None] = [None] * len(members)

        def died(i: int, e: Exception) -> TraceRow:
            return TraceRow.failed(str(members[i]), f"{members[i]}: the worker analyzing it died "
                                   f"({type(e).__name__}: {e})", 0.0)

        for done, (i, row) in enumerate(runner.map(analyze_member, [(str(m), mo) for m in members], died), 1):
            rows[i] = row
            report_progress(done, len(members))
        table = rows_frame([r for r in rows if r is not None])
        del rows  # the table holds the same figures; keep one copy
        summary = summarize(table)
        if options.output is not None:
            written.append(write_parquet(table, options.output))
        if options.report is not None:
            from tracekit.fleet.report import write_fleet_report

            worst = worst_paths(table, WORST_DRAWN)
            # The table holds each path as storable text; the file is opened by the name it has.
            named = {storable(str(m)): str(m) for m in members}
            figures: dict[str, Any] = {}

            def drawing_died(i: int, e: Exception) -> str:
                return f"{worst[i]}: the worker drawing it died ({type(e).__name__}: {e})"

            for i, drawn in runner.map(render_member, [(named.get(p, p),) for p in worst], drawing_died):
                figures[worst[i]] = drawn  # the figures, or why there are none
            written.append(write_fleet_report(table, summary, [(p, figures[p]) for p in worst],
                                              options.report))
    return FleetResult(table, summary, tuple(written))
