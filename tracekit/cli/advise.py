"""``tracekit advise TRACE``: allocator settings under which the recorded run fits, verified by replay."""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown


def advise(
    trace: Path = typer.Argument(..., help="A trace (.parquet): a CuPy recording, a PyTorch import, or raw."),
    limit: str | None = typer.Option(
        None, "--limit", help="The limit to fit under (default: where the device ran out and its free memory "
        "was measured, the room the process had; else the pool limit the run was held to, set by record "
        "or by the program, else the device)."
    ),
    device_total: str | None = typer.Option(
        None, "--device-total", help="The device under the pool (default: unbounded)."
    ),
    jobs: int | None = typer.Option(
        None, "--jobs", "-j", min=1,
        help="Threads replaying settings side by side (default: one per CPU; one for short work)."),
    json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    verify_on_device: int | None = typer.Option(
        None, "--verify-on-device", min=0, help="Re-check the top settings through a real allocator on GPU N."
    ),
    rerun: int | None = typer.Option(
        None, "--rerun", min=1, metavar="N",
        help="Run the recorded program again for real under the N best settings (needs its GPU; "
             "each run recorded into a new folder beside the trace) and say what each did."),
    rerun_timeout: float = typer.Option(
        900.0, "--rerun-timeout", min=1.0, metavar="SECONDS", help="The most one rerun may take (900)."),
    rerun_dir: Path | None = typer.Option(
        None, "--rerun-dir", metavar="DIR", help="A new folder for the reruns' traces and logs."),
    user_code: list[str] = typer.Option(
        [], "--user-code", metavar="PATH",
        help="Your code, where call-sites are named: frames under PATH (repeatable; docs/analysis.md)."),
) -> None:
    """Find settings under which TRACE fits its limit, by replay, and print a paste-ready line."""
    if verify_on_device is None and rerun is None:  # no GPU held: tracekit's own code only (quick_exit)
        skip_teardown()
    from tracekit.cli.analyze import note_unmatched
    from tracekit.cli.common import echo_json, say, terminal_progress
    from tracekit.trace.reader import read_trace
    from tracekit.trace.stacks import UserCode
    from tracekit.units import parse_size

    lim = parse_size(limit, "--limit") if limit is not None else None
    total = parse_size(device_total, "--device-total") if device_total is not None else None
    t = read_trace(trace)
    # The search and its kernels are imported once the trace is read (issue 45: the reading starts
    # within 0.3 s of the process; scripts/bench_startup.py).
    from tracekit.advise.run import advise as run_advise
    from tracekit.trace.callsite import stack_table, unmatched

    note_unmatched(trace, user_code, unmatched(stack_table(t.events), UserCode.of(user_code)))
    with terminal_progress("advising"):
        result = run_advise(t, limit=lim, device_total=total, jobs=jobs, user_code=UserCode.of(user_code))
    if verify_on_device is not None and not result.fits:
        from dataclasses import replace

        note = f"--verify-on-device {verify_on_device}: nothing fits, so there is nothing to verify"
        result = replace(result, notes=(*result.notes, note))
    elif verify_on_device is not None:
        from dataclasses import replace

        from tracekit.advise.on_device import verify
        from tracekit.advise.run import replayed_rows

        own = replayed_rows(t, result)
        result = replace(result, device_checks=verify(own, result.fits, verify_on_device))
    if rerun is not None:
        from dataclasses import replace

        from tracekit.advise.rerun import rerun as run_again

        with terminal_progress("running the program again"):
            runs = run_again(t, result.kind, [o for o in result.tried if o.verdict is not None], rerun,
                             folder=rerun_dir, timeout=rerun_timeout, limit=lim, pool=result.pool,
                             default_alone=result.default_alone, device=result.device or 0)
        result = replace(result, reruns=runs)
    if json_out:
        echo_json(result.to_dict())
    else:
        say(result.to_text())


def register(app: typer.Typer) -> None:
    app.command("advise")(advise)
