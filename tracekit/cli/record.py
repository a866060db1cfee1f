"""``tracekit record [-o TRACE] [--limit SIZE] [--no-sites] [--stack-depth N] [--async-pools] [--rmm]
[--torch] [-m] SCRIPT ...``."""

from __future__ import annotations

import os
from pathlib import Path

import typer

# tracekit.record.callstacks.DEFAULT_DEPTH, not imported: --help loads no NumPy (a test holds them equal)
STACK_DEPTH = 64
MAX_STACK_DEPTH = 4096


def record(
    target: list[str] = typer.Argument(
        None, metavar="SCRIPT [ARGS]...", help="The program and its arguments, as given to python."
    ),
    module: bool = typer.Option(False, "-m", "--module", help="Run a module, like python -m."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Trace to write (default tracekit-<script>-<pid>.parquet)."
    ),
    limit: str | None = typer.Option(
        None, "--limit", help="Cap the pool first, e.g. 256MiB: CuPy's pool.set_limit, or with --torch "
        "torch.cuda.set_per_process_memory_fraction(SIZE / the device's total)."
    ),
    no_sites: bool = typer.Option(False, "--no-sites", help="Record no call-sites nor stacks (cheaper)."),
    stack_depth: int | None = typer.Option(
        None, "--stack-depth", metavar="N", min=0, max=MAX_STACK_DEPTH,
        help=f"Frames kept of each malloc's call stack, innermost first (default {STACK_DEPTH}; 0: the "
             "one call-site only).",
    ),
    async_pools: bool = typer.Option(
        False, "--async-pools", help="Also record CuPy MemoryAsyncPool requests, which fire no memory hook: "
        "wraps cupy.cuda.set_allocator/get_allocator (otherwise nothing of CuPy's is replaced)."),
    rmm: bool = typer.Option(
        False, "--rmm", help="Record RMM's allocations (a program on rmm_cupy_allocator or RMM's PyTorch "
        "allocator): turns RMM's own logging on for each resource the program sets (Python 3.12+)."),
    torch: bool = typer.Option(False, "--torch", help="Record a PyTorch program (its memory history)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output trace."),
) -> None:
    """Run a CuPy (or, with --torch, PyTorch) program unmodified and record its allocations.

    Once the program has run, the exit code is the program's, whatever happens to the trace; the
    "Wrote" line (or why no trace was written) goes to descriptor 2 directly, so a program that
    set ``sys.stderr`` to None or closed its streams changes nothing of it.
    """
    from tracekit.errors import UsageError
    from tracekit.record.runner import tell

    target = list(target or [])
    start = os.getcwd()  # the trace is named as the user's shell sees it, wherever the program went
    if torch:
        if no_sites or stack_depth is not None or async_pools or rmm:
            raise UsageError("--no-sites, --stack-depth, --async-pools and --rmm apply to CuPy recordings, "
                             "not --torch (a PyTorch program on RMM's allocator: record --rmm, no --torch)")
        from tracekit.record.torch import record_torch  # imports torch only when it runs
        from tracekit.units import parse_size

        cap = parse_size(limit, "--limit") if limit is not None else None
        done = record_torch(target, module=module, output=output, force=force, limit=cap)
    else:
        from tracekit.record import record_cupy
        from tracekit.units import parse_size

        size = parse_size(limit, "--limit") if limit is not None else None
        done = record_cupy(target, module=module, output=output, limit=size, sites=not no_sites, force=force,
                           stack_depth=STACK_DEPTH if stack_depth is None else stack_depth,
                           async_pools=async_pools, rmm=rmm)
    if done.problem is not None:
        tell(f"tracekit: error: {done.problem}")
    elif done.path is not None:
        from tracekit.record.final import shown, taken_sentence

        tell(f"Wrote {shown(done.path, start)}")
        if done.taken is not None:  # the program made its own file at the output: kept as it is
            tell(taken_sentence(shown(done.taken, start), shown(done.path, start)))
        _notes(done.path)
    if done.dies_of is not None:  # as python would: the program's KeyboardInterrupt ends in SIGINT
        import signal

        signal.signal(done.dies_of, signal.SIG_DFL)
        os.kill(os.getpid(), done.dies_of)
    raise typer.Exit(done.code)


def _notes(path: Path) -> None:
    """What the trace lacks where the spool did not end whole (the program wrote over it, deleted
    it, cut it short): one sentence each, as ``recover`` says them."""
    from tracekit.record.runner import tell

    try:  # in the program's process, which may have broken json or the recursion limit
        from tracekit.record.recover import spool_notes
        from tracekit.trace.reader import read_meta

        extra = read_meta(path).extra
        notes = spool_notes(extra)
    except Exception:  # the trace is written; a note about it must not turn into a failure
        return
    for note in notes:
        tell(note)
    beside = extra.get("rmm_trace")
    if isinstance(beside, str):
        tell(f"Wrote {path.with_name(beside)} (the allocations the program made through RMM)")
    if extra.get("rmm_unlogged"):
        tell("tracekit: the program allocated through RMM with its logging off, so those allocations are "
             "not in the trace: `tracekit record --rmm` records them")


def register(app: typer.Typer) -> None:
    app.command(
        "record",
        context_settings={"allow_interspersed_args": False, "ignore_unknown_options": True},
    )(record)
