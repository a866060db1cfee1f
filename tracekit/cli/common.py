"""Small helpers shared by the verb modules: JSON output and 'Wrote PATH' lines."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer


def echo_json(obj: Any) -> None:
    """Print one JSON document to stdout (ints stay exact, NaN becomes null)."""
    typer.echo(json.dumps(_clean(obj), indent=2))


def wrote(path: Path | str) -> None:
    typer.echo(f"Wrote {path}", err=True)


# Runs shorter than this finish before a bar helps; the first report after it draws.
PROGRESS_AFTER_S = 0.5


@contextmanager
def terminal_progress(label: str) -> Iterator[None]:
    """A bar on stderr for the library's ``report`` calls in the block, only when stderr is a terminal."""
    from tracekit.progress import Progress, reporting

    if not sys.stderr.isatty():
        yield
        return
    bar = Progress(label)
    start = time.monotonic()

    def receive(done: int, total: int) -> None:
        if time.monotonic() - start >= PROGRESS_AFTER_S:
            bar(done, total)

    try:
        with reporting(receive):
            yield
    finally:
        bar.close()


def _clean(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # NumPy scalars
        return _clean(obj.item())
    if isinstance(obj, Path):
        return str(obj)
    return obj
