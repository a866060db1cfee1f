"""Small helpers shared by the verb modules: JSON output and 'Wrote PATH' lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def echo_json(obj: Any) -> None:
    """Print one JSON document to stdout (ints stay exact, NaN becomes null)."""
    typer.echo(json.dumps(_clean(obj), indent=2))


def wrote(path: Path | str) -> None:
    typer.echo(f"Wrote {path}", err=True)


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
