"""``tracekit import torch SNAPSHOT``: a PyTorch memory snapshot (pickle, optionally gzip) to a trace;
``tracekit import rmm LOG``: an RMM allocation log (CSV of ``logging_resource_adaptor``) to a trace.

The module is named ``importer`` because ``import`` is a Python keyword; it
registers the sub-app under the verb name ``import``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from tracekit.cli.quick_exit import skip_teardown

sub = typer.Typer(
    name="import",
    help="Convert another tool's allocation history into a tracekit trace.",
    no_args_is_help=True,
)


@sub.command("torch")
def torch_cmd(
    snapshot: Path = typer.Argument(
        ..., help="A snapshot from torch.cuda.memory._dump_snapshot (.pickle, or gzip-compressed)."
    ),
    output: Path = typer.Option(
        None, "-o", "--output", help="Trace to write (default: the snapshot's name with .parquet)."
    ),
    device: int = typer.Option(None, "--device", help="Import only this device ordinal (default: all)."),
    stacks: bool = typer.Option(
        False, "--stacks",
        help="Keep C++ frames in the rows' stacks too (snapshots taken with stacks='all'); every row "
             "keeps its whole Python stack either way.",
    ),
    progress: bool = typer.Option(
        None, "--progress/--no-progress", help="Progress bar on stderr (default: files of 64 MiB or more)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output trace."),
) -> None:
    """Import a PyTorch CUDA memory snapshot; untrusted files are safe (nothing in them is run)."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import say, wrote
    from tracekit.importers.torch_snapshot import import_snapshot

    result = import_snapshot(snapshot, output, device=device, stacks=stacks, progress=progress,
                             force=force)
    skipped = ", ".join(f"{n} x {a}" for a, n in sorted(result.skipped.items()))
    if skipped:
        say(f"tracekit: note: {snapshot}: skipped history entries: {skipped}", err=True)
    if result.initial_rows:
        say(
            f"tracekit: note: {snapshot}: the history starts mid-run; {result.initial_rows} rows at t=0 "
            "rebuild the state before it (column 'initial')",
            err=True,
        )
    wrote(result.path)


@sub.command("rmm")
def rmm_cmd(
    log: Path = typer.Argument(
        ..., help="An RMM allocation log (rmm.reinitialize(logging=True, log_file_name=...); one per device)."
    ),
    output: Path = typer.Option(
        None, "-o", "--output", help="Trace to write (default: the log's name with .parquet)."
    ),
    device: int = typer.Option(
        None, "--device", min=0, max=32767,
        help="The device ordinal of the log (default: the N of a .devN file name, else 0).",
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing output trace."),
) -> None:
    """Import an RMM allocation log (Thread,Time,Action,Pointer,Size,Stream); a malformed line is refused."""
    skip_teardown()  # tracekit's own code only: the process may end without the interpreter's teardown
    from tracekit.cli.common import say, wrote
    from tracekit.importers.rmm_log import import_log

    result = import_log(log, output, device=device, force=force)
    if result.null_pointer_rows:
        say(f"tracekit: note: {log}: {result.null_pointer_rows} allocate/free lines of 0 bytes (a null "
            "pointer) make no row", err=True)
    wrote(result.path)


def register(app: typer.Typer) -> None:
    app.add_typer(sub, name="import")
