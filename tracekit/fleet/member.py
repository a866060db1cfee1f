"""One member of a fleet: a worker reads one trace, runs the single-trace engine, returns one row.

This is the only code that touches events, and it runs in a worker (a local
process or a Ray task): the trace is read, ``analyze_trace`` runs on it, the
summary is cut down to a ``TraceRow`` of scalars, and everything else is
dropped before the row goes back to the driver. A member that cannot be read
or analyzed still gives a row, with ``error`` set to one sentence, so one bad
file never stops the others. Optional work per member: the what-if search
(``--whatif``, one process per member, policies one after another), the
recommendation (``--advise``), and the reserved-bytes curve over normalised
time for the fleet report's heat map (``CURVE_BINS`` columns, each the
highest reserved bytes held in it, so no peak is hidden).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracekit.errors import TracekitError
from tracekit.fleet.row import TraceRow, launch_fields
from tracekit.trace.stacks import UserCode

CURVE_BINS = 240


@dataclass(frozen=True)
class MemberOptions:
    """What a worker computes beyond the summary row."""

    whatif: bool = False
    advise: bool = False
    curve: bool = False
    user_code: UserCode = field(default_factory=UserCode)  # what counts as the user's code


def analyze_member(path: str, options: MemberOptions) -> TraceRow:
    """The row for the trace at ``path``; never raises for a bad trace (the row carries the error)."""
    t0 = time.perf_counter()
    try:
        return _analyze(path, options, t0)
    except TracekitError as e:
        return TraceRow.failed(path, str(e), time.perf_counter() - t0)
    except MemoryError:
        return TraceRow.failed(path, f"{path}: ran out of host memory while analyzing it",
                               time.perf_counter() - t0)
    except Exception as e:  # a bug or a file that breaks the engine must not stop the other members
        return TraceRow.failed(path, f"{path}: analysis failed ({type(e).__name__}: {e})",
                               time.perf_counter() - t0)


def _analyze(path: str, options: MemberOptions, t0: float) -> TraceRow:
    from tracekit.analysis import analyze_trace
    from tracekit.trace import read_trace

    # Replays use extra columns (a wrapped history's starting state), the analysis reads its own.
    trace = read_trace(path, extras=options.whatif or options.advise)
    result = analyze_trace(trace, timeline=options.curve, user_code=options.user_code)
    curve = None
    if result.timeline is not None:
        tl = result.timeline
        oom = result.summary.oom if result.summary.oom and not result.summary.oom.handled else None
        curve = reserved_curve(tl.column("t_ns").to_numpy(), tl.column("seq").to_numpy(),
                               tl.column("reserved_bytes").to_numpy(), CURVE_BINS, oom.seq if oom else None)
        result = type(result)(summary=result.summary, timeline=None)  # let the table go now
    whatif = None
    if options.whatif:
        from tracekit.advise.capacity import whatif as run_whatif

        whatif = run_whatif(trace, jobs=1)  # the fleet already runs one member per CPU
    advice: tuple[str | None, str | None] = (None, None)
    if options.advise:
        from tracekit.fleet.advice import recommend

        advice = recommend(trace, options.user_code)
    return TraceRow.from_summary(
        path, trace.meta, result.summary, *launch_fields(Path(path), trace.meta),
        device_index=result.summary.device,
        whatif=whatif, advice=advice if options.advise else None, curve=curve,
        seconds=time.perf_counter() - t0,
    )


@dataclass(frozen=True, eq=False)
class Curve:
    """Reserved bytes over normalised time (``CURVE_BINS`` values) and where the fatal OOM sits on it."""

    reserved: np.ndarray  # int64: 2 KiB a trace on its way to the driver, not a tuple of Python ints
    oom_at: float | None  # x of the fatal OOM in [0, 1], None without one


def reserved_curve(t_ns: np.ndarray, seq: np.ndarray, reserved: np.ndarray, bins: int,
                   oom_seq: int | None = None) -> Curve:
    """Reserved bytes over normalised time: ``bins`` columns, each the highest value held in it.

    x is the report's time axis (seconds from the first event, or the event
    index when times carry no information), scaled to [0, 1]. Column b covers
    [b/bins, (b+1)/bins); its value is the maximum of the reserved bytes of its
    events and of the value carried in from the event before it (the curve is
    a step function), so an empty column holds the last value before it.
    """
    from tracekit.report.style import time_axis

    n = len(reserved)
    if n == 0:
        return Curve(np.zeros(bins, np.int64), None)
    x = time_axis(t_ns, seq).x(t_ns, np.arange(n))
    span = float(x[-1] - x[0])
    xn = (x - x[0]) / span if span > 0 else np.zeros(n)
    col = np.minimum((xn * bins).astype(np.int64), bins - 1)
    starts = np.searchsorted(col, np.arange(bins), side="left")
    filled = starts < np.append(starts[1:], n)
    y = reserved.astype(np.int64)
    top = np.zeros(bins, np.int64)
    top[filled] = np.maximum.reduceat(y, starts[filled])
    carried = np.where(starts > 0, y[np.maximum(starts - 1, 0)], 0)
    oom_at = None
    if oom_seq is not None:
        k = min(int(np.searchsorted(seq, np.uint64(oom_seq))), n - 1)
        oom_at = float(xn[k])
    return Curve(np.maximum(top, carried), oom_at)


def render_member(path: str) -> list[Any] | str:
    """The single-trace report's figures for ``path`` rendered to PNG (in a worker), or why not."""
    from tracekit.report.build import build_figures
    from tracekit.trace import read_trace

    try:
        rendered, _, _ = build_figures(read_trace(path), None, Path(path).name)
    except TracekitError as e:
        return str(e)
    except Exception as e:  # the rows are still worth a page; say which drawing failed
        return f"{path}: drawing its figures failed ({type(e).__name__}: {e})"
    return rendered
