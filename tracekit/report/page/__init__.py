"""The report as one interactive, self-contained HTML page the browser draws.

``write_page(trace_path, output)`` reads a trace, runs the analyzer (unless a result is
passed in), builds the data model (``tracekit.report.page.data``; shapes in
``tracekit.report.page.model``, documented in ``docs/report-page.md``) and writes one HTML
file with the model as JSON and the page's scripts inlined (``tracekit.report.page.html``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tracekit import progress
from tracekit.inputs import safe_text
from tracekit.outputs import check_folder, check_output, write_bytes
from tracekit.trace import read_meta, read_trace
from tracekit.trace.stacks import UserCode


def write_page(
    trace_path: Path,
    output: Path,
    analysis: Any = None,
    *,
    png_dir: Path | None = None,
    baseline: Path | None = None,
    whatif: Any = None,
    force: bool = False,
    advise: bool = False,
    user_code: Sequence[str] = (),
    limit: int | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Path:
    """Write the page for ``trace_path`` to ``output``; ``whatif``: True (run it), a result, or its JSON path.

    ``png_dir``: also the matplotlib figures as PNG files there (``tracekit.report.build``),
    drawn from the same analysis and what-if result. Existing outputs are refused unless
    ``force``; an input never is an output. A bad baseline or what-if file fails before the
    trace is analysed. ``user_code``: the paths whose frames are the user's code (``--user-code``;
    none: the frames the recorder saw outside installed packages and Python's own library).
    ``limit``: the limit advise fits under (bytes; default the recorded one); ``on_note`` is told, in
    one sentence, why advise could not run when it could not (the page says it too).
    """
    from tracekit.analysis import analyze_trace
    from tracekit.report.page.data import build_model
    from tracekit.report.page.html import page

    trace_path, output = Path(trace_path), Path(output)
    inputs = (
        (trace_path,)
        + ((Path(baseline),) if baseline else ())
        + ((Path(whatif),) if isinstance(whatif, str | os.PathLike) else ())
    )
    check_output(output, inputs, force=force)
    if png_dir is not None:
        check_folder(png_dir, "--png")
    if baseline is not None:
        read_meta(baseline)
    wd = _whatif_dict(whatif) if whatif is not None and whatif is not True else None
    trace = read_trace(trace_path)
    users = UserCode.of(user_code)
    parts = 2 if png_dir is None else 3
    with progress.part(0, parts):
        if analysis is None or getattr(analysis, "timeline", None) is None:
            analysis = analyze_trace(trace, timeline=True, user_code=users)
    with progress.part(1, parts):
        base = None
        if baseline is not None:
            bt = read_trace(Path(baseline))
            base = (safe_text(Path(baseline).name), bt, analyze_trace(bt, timeline=True, user_code=users))
        if whatif is True:
            from tracekit.advise.capacity import whatif as run_whatif

            wd = _whatif_dict(run_whatif(trace))
        model = build_model(
            trace,
            analysis,
            safe_text(trace_path.name),  # a name that is not UTF-8 holds surrogates no page can encode
            baseline=base,
            whatif=wd,
            advise=_advise(trace, limit, on_note) if advise else None,
            user_code=users,
        )
        doc = page(model)
    if png_dir is not None:
        from tracekit.report.build import write_report

        with progress.part(2, parts):
            write_report(
                trace_path,
                None,
                analysis,
                png_dir=png_dir,
                baseline=baseline,
                whatif=wd,
                force=force,
                advise=advise,
            )
    write_bytes(output, doc.encode("utf-8"))
    return output


def _whatif_dict(whatif: Any) -> dict[str, Any]:
    from tracekit.report.sections import load_whatif

    return load_whatif(whatif)


def _advise(trace: Any, limit: int | None, on_note: Callable[[str], None] | None) -> dict[str, Any] | str:
    """``tracekit advise`` on the trace as a dict, or the one-sentence reason it could not run (also
    told to ``on_note``)."""
    from tracekit.advise.run import advise
    from tracekit.errors import UsageError

    try:
        return dict(advise(trace, limit=limit).to_dict())
    except UsageError as e:
        if on_note is not None:
            on_note(f"advise did not run: {e}")
        return str(e)


__all__ = ["write_page"]
