"""The report: one interactive, self-contained HTML page the browser draws.

``write_page(trace_path, output)`` reads the trace once, runs the analyzer (unless a result is passed
in), advise and the what-if search when asked (once each), builds the data model from those typed
results (``tracekit.report.page.data``; shapes in ``tracekit.report.page.model``, documented in
``docs/report-page.md``) and writes one HTML file with the model as JSON and the page's scripts
inlined (``tracekit.report.page.html``). ``--png`` figures are drawn from the same results
(``tracekit.report.build.write_figures``). ``tracekit report`` and ``analyze --report`` both write it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit import progress
from tracekit.errors import InputError
from tracekit.inputs import safe_text, shell_word
from tracekit.outputs import check_folder, check_output, write_bytes
from tracekit.trace import Trace, read_meta, read_trace
from tracekit.trace.stacks import UserCode

if TYPE_CHECKING:
    from tracekit.advise.capacity import WhatIfResult
    from tracekit.advise.result import AdviseResult
    from tracekit.analysis.analyze import AnalysisResult


def write_page(
    trace_path: Path,
    output: Path,
    analysis: AnalysisResult | None = None,
    *,
    trace: Trace | None = None,
    png_dir: Path | None = None,
    baseline: Path | None = None,
    whatif: WhatIfResult | str | os.PathLike[str] | bool | None = None,
    force: bool = False,
    advise: bool | AdviseResult = False,
    user_code: Sequence[str] = (),
    limit: int | None = None,
    on_note: Callable[[str], None] | None = None,
) -> Path:
    """Write the page for ``trace_path`` to ``output``.

    ``trace``/``analysis``: the trace already read and its ``AnalysisResult`` (with its timeline), so
    nothing is read or analysed twice; ``whatif``: True (run the search), a ``WhatIfResult``, or the path
    of ``whatif --json`` output; ``advise``: True (run it) or an ``AdviseResult``; ``limit``: the limit
    advise fits under (bytes; default the recorded one); ``on_note`` is told, in one sentence, why advise
    could not run when it could not (the page says it too). ``png_dir``: also the matplotlib figures as
    PNG files there, drawn from the same results. Existing outputs are refused unless ``force``; an input
    never is an output. A bad baseline or what-if file fails before the trace is analysed.
    ``user_code``: the paths whose frames are the user's code (``--user-code``; none: the frames the
    recorder saw outside installed packages and Python's own library).
    """
    from tracekit.analysis import analyze_trace
    from tracekit.report.page.data import build_model
    from tracekit.report.page.html import page

    trace_path, output = Path(trace_path), Path(output)
    saved = Path(whatif) if isinstance(whatif, str | os.PathLike) else None
    inputs = (trace_path,) + ((Path(baseline),) if baseline else ()) + ((saved,) if saved else ())
    check_output(output, inputs, force=force)
    if png_dir is not None:
        check_folder(png_dir, "--png")
    if baseline is not None:
        read_meta(baseline)
    wi: WhatIfResult | None = None
    if saved is not None:
        wi = _load_whatif(saved, trace_path)
    elif whatif is not None and not isinstance(whatif, bool | str | os.PathLike):
        wi = whatif
    if trace is None:
        trace = read_trace(trace_path)
    users = UserCode.of(user_code)
    parts = 2 if png_dir is None else 3
    with progress.part(0, parts):
        if analysis is None or analysis.timeline is None:
            analysis = analyze_trace(trace, timeline=True, user_code=users)
    with progress.part(1, parts):
        base = None
        if baseline is not None:
            bt = read_trace(Path(baseline))
            base = (safe_text(Path(baseline).name), bt, analyze_trace(bt, timeline=True, user_code=users))
        if whatif is True:
            from tracekit.advise.capacity import whatif as run_whatif

            wi = run_whatif(trace)
        advised = _advise(trace, limit, on_note) if advise is True else advise or None
        name = safe_text(trace_path.name)  # a name that is not UTF-8 holds surrogates no page can encode
        model = build_model(trace, analysis, name, baseline=base, whatif=wi, advise=advised, user_code=users)
        doc = page(model)
    if png_dir is not None:
        from tracekit.advise.result import AdviseResult
        from tracekit.report.build import write_figures

        with progress.part(2, parts):
            write_figures(trace, analysis, Path(png_dir), name=name, inputs=inputs, outputs=(output,),
                          baseline=base, whatif=wi,
                          advise=advised if isinstance(advised, AdviseResult) else None, force=force)
    write_bytes(output, doc.encode("utf-8"))
    return output


def _load_whatif(path: Path, trace_path: Path) -> WhatIfResult:
    """Saved ``tracekit whatif --json`` output as its result (InputError naming the file when it is not,
    or when it was made for another trace than ``trace_path``)."""
    from tracekit.advise.capacity import WhatIfResult
    from tracekit.report.sections import load_whatif

    d = load_whatif(path)
    made_for = d.get("trace")
    if isinstance(made_for, str) and not _same_trace(Path(made_for), trace_path):
        raise InputError(f"{safe_text(path)}: holds the what-if of {safe_text(made_for)}, not of "
                         f"{safe_text(trace_path)}; run tracekit whatif {shell_word(str(trace_path))} --json")
    return WhatIfResult.from_dict(d)


def _same_trace(a: Path, b: Path) -> bool:
    """The same file where both are there (by device and inode), else the same file name."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return a.name == b.name


def _advise(trace: Trace, limit: int | None, on_note: Callable[[str], None] | None) -> AdviseResult | str:
    """``tracekit advise`` on the trace, or the one-sentence reason it could not run (also told to
    ``on_note``)."""
    from tracekit.advise.run import advise
    from tracekit.errors import UsageError

    try:
        return advise(trace, limit=limit)
    except UsageError as e:
        if on_note is not None:
            on_note(f"advise did not run: {e}")
        return str(e)


__all__ = ["write_page"]
