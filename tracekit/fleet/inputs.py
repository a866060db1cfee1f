"""The members of a fleet: the PATH arguments expanded to trace files, in a stable order.

Each PATH is a file (taken as given, even when it is missing or broken: its
row then says why), a folder (every ``*.parquet`` directly inside it) or a
glob pattern (``runs/*/rank*.parquet``, ``**`` included). Files are taken
once each, in the order given, folders and globs sorted by name: one file is
one member however it is named (a hard link, a symbolic link, a ``..``:
files are told apart by device and inode, as ``os.stat`` gives them). A folder or
pattern that names no trace is an error before any work starts, and so is
an output path (``-o``, ``--report``) that is also a member.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from tracekit.errors import InputError, OutputError, UsageError
from tracekit.inputs import os_cause, safe_text, stat_or_none

_GLOB_CHARS = frozenset("*?[")


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Every trace file the PATH arguments name, each once (see the module docstring)."""
    if not paths:
        raise UsageError("give at least one PATH: a trace file, a folder of traces or a glob")
    out: list[Path] = []
    seen: set[tuple[int, int] | str] = set()
    for arg in paths:
        for p in _expand_one(str(arg)):
            key = identity(p)
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def identity(p: Path) -> tuple[int, int] | str:
    """What makes two names one file: (device, inode) where the file exists, else the absolute name."""
    try:
        st = os.stat(p)
    except (OSError, ValueError):  # missing or unreachable: its row will say why
        return os.path.abspath(p)
    return st.st_dev, st.st_ino


def largest_size(members: Sequence[Path]) -> int:
    """Bytes of the largest member file (0 for none, or where none can be reached)."""
    def size(p: Path) -> int:
        try:
            return os.stat(p).st_size
        except (OSError, ValueError):
            return 0

    return max((size(m) for m in members), default=0)


def _is_file(p: Path | str) -> bool:
    """A regular file (after links); False for anything os.stat cannot reach, where pathlib may raise."""
    try:
        return stat.S_ISREG(os.stat(p).st_mode)
    except (OSError, ValueError):
        return False


def _expand_one(arg: str) -> Iterable[Path]:
    p = Path(arg)
    st = stat_or_none(p, "trace")  # one sentence for a name too long, a folder one may not enter
    if st is not None and stat.S_ISDIR(st.st_mode):
        try:  # scandir, not Path.glob: glob says nothing of a folder one may not read
            with os.scandir(p) as entries:
                found = sorted(Path(e.path) for e in entries if e.name.endswith(".parquet")
                               and _is_file(e.path) and not is_fleet_table(e.path))
        except OSError as e:
            raise InputError(f"{safe_text(p)}: cannot list the folder ({os_cause(e)})") from None
        if not found:
            raise InputError(f"{safe_text(p)}: the folder holds no .parquet trace")
        return found
    if st is None and _GLOB_CHARS & set(arg):
        matched = sorted(Path(m) for m in glob.glob(arg, recursive=True)
                         if _is_file(m) and not is_fleet_table(m))
        if not matched:
            raise InputError(f"{safe_text(arg)}: no file matches this pattern")
        return matched
    return [p]


FLEET_KEY = b"tracekit.fleet"  # in the schema metadata of a table fleet wrote (``fleet.table``)


def is_fleet_table(path: str | Path) -> bool:
    """A table an earlier fleet wrote (its footer says so): a folder's or pattern's trace it is not.
    A file that cannot be read as Parquet is no fleet table: its member row says what it is."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception:  # anything Arrow raises on a file that is no Parquet: not a fleet table
        return False
    return FLEET_KEY in meta


def check_outputs(members: Sequence[Path], outputs: Iterable[tuple[Path | None, str]], *,
                  force: bool = False) -> None:
    """Refuse an output that is one of the members (even a missing one), or that the output policy
    (``tracekit.outputs.check_output``) refuses: an existing file without ``force``, a folder."""
    from tracekit.outputs import check_output

    named = [(Path(o), opt) for o, opt in outputs if o is not None]
    keys = {identity(m) for m in members}
    for out, opt in named:
        if identity(out) in keys:
            raise OutputError(f"{safe_text(out)}: {opt} names one of the traces; choose another {opt}")
        check_output(out, members, option=opt, force=force)
    if len({identity(o) for o, _ in named}) != len(named):
        raise UsageError(f"{safe_text(named[0][0])}: the same path is given for two outputs")
