"""Where a recording's trace is finished: its output, or a free name beside it.

The output name was free when the recording started (or, with ``--force``, held a file the user
allowed replacing: ``Keep.at_start`` notes which). A program may make its own file there while it
runs, a file, a folder or a symbolic link; nothing of it is replaced, and no link is followed. The
trace then goes to the first free sibling name, ``out.1.parquet``, ``out.2.parquet``, ... (``out.1``
for an output without the ``.parquet`` suffix), and the metadata names the output the program took
(``output_taken``). Every name is written through the one atomic writer (``tracekit.outputs``):
checked free, written to a temporary file, then linked into place, and ``link(2)`` fails on any
name that exists, a dangling link included, so a name taken meanwhile sends the trace to the next
one. Both finishers choose the path here: the recorded process at its end
(``session.CupyRecording.stop``, ``torch.record_torch``) and the watcher (``watch._finish``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracekit.errors import OutputError
from tracekit.outputs import check_output

SUFFIX = ".parquet"
MAX_SIBLINGS = 10_000
NAME_MAX = 255  # bytes of one path component (Linux, most file systems)


@dataclass(frozen=True)
class Keep:
    """The file at the output the recording may replace (``--force``: the one there at the start, by
    device, inode and change time, so a file the program made in its place is another even where
    it got the same inode; a link itself, not followed); None for none."""

    dev: int
    ino: int
    ctime_ns: int

    @classmethod
    def at_start(cls, output: Path, force: bool) -> Keep | None:
        if not force:
            return None
        try:
            st = os.lstat(output)
        except (OSError, ValueError):
            return None
        return cls(st.st_dev, st.st_ino, st.st_ctime_ns)

    def text(self) -> str:
        return f"{self.dev}:{self.ino}:{self.ctime_ns}"

    @classmethod
    def parse(cls, text: str) -> Keep | None:
        parts = text.split(":")
        return cls(*map(int, parts)) if len(parts) == 3 and all(x.isdigit() for x in parts) else None

    def names(self, st: os.stat_result) -> bool:
        return (st.st_dev, st.st_ino, st.st_ctime_ns) == (self.dev, self.ino, self.ctime_ns)


def sibling(output: Path, n: int) -> Path:
    """``out.N.parquet`` beside ``out.parquet`` (``NAME.N`` beside a ``NAME`` of another suffix),
    the base cut where the name would pass a file system's bound."""
    name = output.name
    base, suffix = (name[:-len(SUFFIX)], SUFFIX) if name.endswith(SUFFIX) and name != SUFFIX else (name, "")
    tag = f".{n}{suffix}"
    room = NAME_MAX - len(os.fsencode(tag))
    raw = os.fsencode(base)
    if len(raw) > room:  # a UTF-8 name loses the bytes of a character cut in two
        base = raw[:room].decode("utf-8", "ignore") if _utf8(raw) else os.fsdecode(raw[:room])
    return output.with_name(base + tag)


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _taken(path: Path, keep: Keep | None) -> bool:
    """Whether anything is at ``path`` (a link, not followed) other than the file ``keep`` allows
    replacing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True  # a name that cannot be looked at is not one to write
    return keep is None or not keep.names(st)


def candidates(output: Path) -> Iterator[Path]:
    yield output
    for n in range(1, MAX_SIBLINGS + 1):
        yield sibling(output, n)


def write_final(output: Path, write: Callable[[Path, dict[str, Any]], Any], keep: Keep | None = None) -> Path:
    """Write the trace with ``write(path, extra)`` at ``output``, or, where the program made its own
    file there, at the first free sibling name (``extra`` then names ``output_taken``, for the
    metadata); returns where it went. An error other than a name taken is raised as it is."""
    for path in candidates(output):
        mine = path == output
        if _taken(path, keep if mine else None):
            continue
        replace = mine and keep is not None and os.path.lexists(path)
        check_output(path, force=replace)  # claims the name: the commit then never replaces a file
        try:
            write(path, {} if mine else {"output_taken": str(output)})
        except OutputError:
            if not _taken(path, keep if mine else None):
                raise
            continue  # a file took the name while the trace was written: the next name
        return path
    raise OutputError(f"{output}: the program made its own file there and every name beside it up to "
                      f"{sibling(output, MAX_SIBLINGS).name} is taken; nothing was written over")


def taken_sentence(output: str, final: str) -> str:
    """The one sentence ``record`` says where the trace went to a sibling name."""
    return (f"tracekit: the program wrote its own file at {output} (kept as it is), so the trace is at "
            f"{final}")


def shown(path: Path, start: str) -> str:
    """``path`` relative to ``start`` where it lies below it, else as it is (absolute)."""
    try:
        return str(path.relative_to(start))
    except ValueError:
        return str(path)
