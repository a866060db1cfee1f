"""A test over its budget: the failure message (the peak, where it happened, advise's setting)."""

from __future__ import annotations

from pathlib import Path

from tracekit.units import format_size as fs

TOP = 5


def where_lines(trace_path: Path) -> tuple[list[str], object | None]:
    """("the user's line" and the top stacks at the peak of live bytes, the trace read)."""
    from tracekit.advise.run import top_sites_at_peak
    from tracekit.trace.reader import read_trace

    trace = read_trace(trace_path)
    sites = top_sites_at_peak(trace)
    if not sites:
        return ["where: no call-site was recorded at the peak"], trace
    first = sites[0]
    lines = [f"the user's line: {first.user_site or first.site or 'unknown'}",
             "top stacks at the peak (live bytes):"]
    for s in sites[:TOP]:
        lines.append(f"  {fs(s.bytes):>12} in {s.blocks} block(s)  {s.site or 'no call-site'}")
    return lines, trace


def advise_line(trace: object, budget: int) -> str:
    """What ``tracekit advise --limit BUDGET`` recommends, in one sentence (or why it could not)."""
    try:
        from tracekit.advise.run import advise

        result = advise(trace, limit=budget, jobs=1)  # type: ignore[arg-type]
        return f"advise (--limit {fs(budget)}): {result.recommendation()}"
    except Exception as e:  # advise must never turn a budget failure into a crash
        return f"advise could not run on this test's trace ({type(e).__name__}: {e})"


def message(*, metric: str, peak: int, budget: int, device: int, backend: str,
            trace_path: Path | None, trace_error: str | None, run_advise: bool, kept: bool) -> str:
    head = (f"GPU memory over budget: peak {metric} {fs(peak)} on device {device} ({backend}) "
            f"> limit_gpu_memory {fs(budget)} (by {fs(peak - budget)})")
    lines = [head]
    trace = None
    if trace_path is not None:
        try:
            where, trace = where_lines(trace_path)
            lines += where
        except Exception as e:
            lines.append(f"where: the test's trace could not be read ({type(e).__name__}: {e})")
    else:
        lines.append(f"where: no trace of this test ({trace_error or 'none recorded'})")
    if metric in ("reserved", "device") and run_advise:
        lines.append(advise_line(trace, budget) if trace is not None else
                     "advise: not run (no trace of this test)")
    if trace_path is not None and kept:
        lines.append(f"trace: {trace_path}")
    return "\n".join(lines)


def leak_message(*, leaked: int, budget: int, warmups: int, backend: str,
                 trace_path: Path | None) -> str:
    lines = [f"GPU memory leaked: {fs(leaked)} still live after the test ({backend}, after {warmups} "
             f"warm-up call(s)) > limit_gpu_leaks {fs(budget)}"]
    if trace_path is not None:
        lines.append(f"trace: {trace_path} (tracekit analyze shows what is still live)")
    return "\n".join(lines)
