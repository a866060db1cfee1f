"""Small helpers shared by the verb modules: text, JSON and 'Wrote PATH' lines.

Everything a verb prints goes through ``say`` (or ``echo_json``): a trace's call-sites,
commands, device names and file names are text its author controls, and a terminal acts on
escape sequences (clear the screen, set the title, plant a hyperlink) and bidi controls
(reverse a line). ``say`` escapes each such character as ``repr`` does
(``tracekit.inputs.safe_text``); JSON escapes them itself (``\\u001b``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer


def say(text: object, *, err: bool = False) -> None:
    """Print ``text`` (lines tracekit composed, holding text from traces) with every character a
    terminal would act on escaped; newlines kept."""
    from tracekit.inputs import safe_text

    typer.echo(safe_text(text, lines=True), err=err)


def echo_json(obj: Any) -> None:
    """Print one JSON document to stdout (ints stay exact, NaN becomes null)."""
    typer.echo(json.dumps(_clean(obj), indent=2))


def wrote(path: Path | str) -> None:
    say(f"Wrote {path}", err=True)


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
