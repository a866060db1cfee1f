"""The members of a fleet: the PATH arguments expanded to trace files, in a stable order.

Each PATH is a file (taken as given, even when it is missing or broken: its
row then says why), a folder (every ``*.parquet`` directly inside it) or a
glob pattern (``runs/*/rank*.parquet``, ``**`` included). Files are taken
once each, in the order given, folders and globs sorted by name. A folder or
pattern that names no trace is an error before any work starts, and so is
an output path (``-o``, ``--report``) that is also a member.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable, Sequence
from pathlib import Path

from tracekit.errors import InputError, OutputError, UsageError

_GLOB_CHARS = frozenset("*?[")


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Every trace file the PATH arguments name, each once (see the module docstring)."""
    if not paths:
        raise UsageError("give at least one PATH: a trace file, a folder of traces or a glob")
    out: list[Path] = []
    seen: set[Path] = set()
    for arg in paths:
        for p in _expand_one(str(arg)):
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def _expand_one(arg: str) -> Iterable[Path]:
    p = Path(arg)
    if p.is_dir():
        found = sorted(q for q in p.glob("*.parquet") if q.is_file())
        if not found:
            raise InputError(f"{p}: the folder holds no .parquet trace")
        return found
    if not p.exists() and _GLOB_CHARS & set(arg):
        matched = sorted(Path(m) for m in glob.glob(arg, recursive=True) if Path(m).is_file())
        if not matched:
            raise InputError(f"{arg}: no file matches this pattern")
        return matched
    return [p]


def check_outputs(members: Sequence[Path], outputs: Iterable[tuple[Path | None, str]], *,
                  force: bool = False) -> None:
    """Refuse an output that is one of the members (even a missing one), or that the output policy
    (``tracekit.outputs.check_output``) refuses: an existing file without ``force``, a folder."""
    from tracekit.outputs import check_output

    named = [(Path(o), opt) for o, opt in outputs if o is not None]
    keys = {m.resolve() for m in members}
    for out, opt in named:
        if out.resolve() in keys:
            raise OutputError(f"{out}: {opt} names one of the traces; choose another {opt}")
        check_output(out, members, option=opt, force=force)
    if len({o.resolve() for o, _ in named}) != len(named):
        raise UsageError(f"{named[0][0]}: the same path is given for two outputs")
