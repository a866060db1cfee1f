"""Every file tracekit writes goes through here: checked first, written atomically, cleaned up always.

``check_output`` is the one policy for an output path, applied before any
work is done: its folder must exist and be one this process may write in; it
must not be a folder, a device node, a FIFO or a socket (only regular files
are written, and only by rename, so a device node is never replaced); it must
not be any of the inputs, whatever
its name (the same file through a link, a ``..`` or a hard link counts); and
an existing file is refused unless ``force``. ``atomic_output`` then writes to
a temporary file beside the target and renames it into place only when the
write finished cleanly. The temporary file is
a hidden ``.NAME.tmp-PID`` file, removed on every way out Python can catch,
SIGTERM included (the CLI turns it into an exception) and ``atexit``; one left
by a killed process (``kill -9``) is swept away by the next write of the same
target.

The commit never replaces a file the checks did not see: when ``check_output``
found the target absent, the temporary file is hard-linked to the target's name
(``link(2)`` fails if any file took that name meanwhile: another run, a sync)
and then unlinked, so a file that appeared while the verb ran is kept and the
verb ends with one sentence; only ``force`` lets the commit replace (rename).
Every ``OSError`` on the way (a folder one may not enter, a read-only folder,
a full disk, a name too long, a symbolic-link loop) becomes an ``OutputError``
naming the file and the cause, and every path in a message passes through
``safe_text`` (a file name can hold terminal escapes).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import glob
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from tracekit.errors import OutputError
from tracekit.inputs import os_cause, safe_text

_PENDING: set[Path] = set()  # named temporary files not yet renamed into place
# Outputs checked by ``check_output`` and not yet committed: absolute path -> whether the commit may
# replace a file found there (only with ``force``; two checks of one path must both allow it).
_CLAIMS: dict[str, bool] = {}


def cannot_write(path: Path | str, e: BaseException, what: str = "") -> OutputError:
    """The one sentence for an ``OSError`` while writing ``path``: the file, then the cause."""
    return OutputError(f"{safe_text(path)}: cannot write{' ' + what if what else ''} ({os_cause(e)})")


def _kind(mode: int) -> str | None:
    """None for a regular file, else the user's word for what the path is."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def refuse_kind(path: Path) -> os.stat_result | None:
    """OutputError unless ``path`` is absent or a regular file; its stat (None when absent)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise cannot_write(path, e) from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise OutputError(f"{safe_text(path)}: cannot write, it is {kind}; outputs are regular files only")
    return st


def refuse_input(path: Path, inputs: Iterable[Path | str | None], option: str = "-o") -> None:
    """OutputError if ``path`` is the same file as any input (by device and inode, whatever the name)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return  # absent: it cannot be an input that exists
    for src in inputs:
        if src is None:
            continue
        try:
            if _same(st, os.stat(src)):
                raise OutputError(f"{safe_text(path)}: refusing to overwrite the input {safe_text(src)}; "
                                  f"choose another {option}")
        except (OSError, ValueError):
            continue


def _refuse_no_folder(path: Path) -> Path:
    """The folder ``path`` goes into; OutputError if it is not one."""
    parent = path.parent if str(path.parent) else Path(".")
    try:
        st = os.stat(parent)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except (OSError, ValueError) as e:  # a folder one may not enter, a name too long, a link loop
        raise cannot_write(path, e) from None
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{safe_text(path)}: cannot write, folder {safe_text(parent)} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):  # before any work: as the file made there would fail
        try:
            read_only = bool(os.statvfs(parent).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        raise cannot_write(path, OSError(errno.EROFS if read_only else errno.EACCES, "")) from None
    return parent


def check_output(path: Path | str, inputs: Iterable[Path | str | None] = (), *, option: str = "-o",
                 force: bool = False) -> Path:
    """The output policy (see the module docstring); returns ``path`` as a Path."""
    path = Path(path)
    _refuse_no_folder(path)
    st = refuse_kind(path)
    refuse_input(path, inputs, option)
    if st is not None and not force:
        raise OutputError(f"{safe_text(path)}: already exists; choose another {option} or pass --force")
    key = os.path.abspath(path)
    _CLAIMS[key] = _CLAIMS.get(key, True) and force
    return path


def check_folder(folder: Path | str, option: str) -> Path:
    """A folder outputs go into: absent (it will be made) or a folder; never a file."""
    folder = Path(folder)
    try:
        st = os.stat(folder)
    except (FileNotFoundError, NotADirectoryError):
        return folder
    except (OSError, ValueError) as e:
        raise cannot_write(folder, e, f"{option} files there") from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{safe_text(folder)}: cannot write {option} files there, it is not a folder")
    return folder


class Staged:
    """A temporary file ``tmp`` beside ``path``: ``commit`` renames it into place, ``discard`` removes it.

    As a context manager it commits when the block ends cleanly and discards
    otherwise; an ``OSError`` of the block (a full disk) becomes the one ``OutputError``
    sentence. For writers that want a file name (Arrow, matplotlib).
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        parent = _refuse_no_folder(self.path)
        refuse_kind(self.path)
        fd, self.tmp = _open_temp(self.path, parent)
        os.close(fd)

    def commit(self) -> Path:
        _commit(self.path, self.tmp)
        return self.path

    def discard(self) -> None:
        _discard(self.tmp)
        _CLAIMS.pop(os.path.abspath(self.path), None)

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        try:
            if et is None:
                self.commit()
            elif isinstance(e, OSError):
                raise cannot_write(self.path, e) from None
        finally:
            self.discard()


@contextlib.contextmanager
def atomic_output(path: Path | str) -> Iterator[BinaryIO]:
    """A binary file whose content replaces ``path`` only if the ``with`` block ends cleanly."""
    with Staged(path) as staged, open(staged.tmp, "wb") as f:
        yield f


def write_bytes(path: Path | str, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_output``)."""
    with atomic_output(path) as f:
        f.write(data)
    return Path(path)


def _open_temp(path: Path, parent: Path) -> tuple[int, Path]:
    """A hidden temporary file beside ``path``, registered for cleanup."""
    _sweep(path, parent)
    tmp = parent / f".{path.name}.tmp-{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)  # our own pid's leftover from an earlier write of this name
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except (OSError, ValueError) as e:  # a read-only folder, a name too long with the prefix
        raise cannot_write(path, e) from None
    _PENDING.add(tmp)
    return fd, tmp


def _sweep(path: Path, parent: Path) -> None:
    """Remove this target's temporary files left by processes that no longer run (``kill -9``)."""
    with contextlib.suppress(OSError):
        for old in parent.glob(f".{glob.escape(path.name)}.tmp-*"):
            pid = old.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                old.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # e.g. another user's process: leave its file alone
    return True


def _commit(path: Path, tmp: Path) -> None:
    """Move ``tmp`` to ``path``: a rename where the checks allowed replacing (``force``, or a
    write no check claimed), else a no-replace move that refuses a file that appeared meanwhile."""
    refuse_kind(path)  # it may have become a device or pipe meanwhile: never rename over those
    may_replace = _CLAIMS.pop(os.path.abspath(path), True)
    try:
        if may_replace:
            os.replace(tmp, path)
        else:
            _move_no_replace(tmp, path)
    except FileExistsError:
        raise OutputError(f"{safe_text(path)}: a file of that name appeared while this command ran; it "
                          "was left as it is and nothing was written (pass --force to replace it)") from None
    except OSError as e:
        raise cannot_write(path, e) from None
    _PENDING.discard(tmp)


def _move_no_replace(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path`` unless ``path`` exists (FileExistsError then, both untouched).

    ``link(2)`` is the atomic check (it never replaces); the temporary name is then unlinked. On
    a file system without hard links the check and the rename are two steps (a window of
    microseconds instead of the whole run)."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path)) from None
        os.rename(tmp, path)
        return
    with contextlib.suppress(OSError):  # the output is in place; a leftover name is swept later
        os.unlink(tmp)


def _discard(tmp: Path) -> None:
    if tmp in _PENDING:
        with contextlib.suppress(OSError):
            tmp.unlink()
        _PENDING.discard(tmp)


@atexit.register
def cleanup() -> None:
    """Remove every named temporary file not yet renamed into place and forget the checks of outputs
    not written (called on exit, and by the CLI when a verb ends)."""
    for tmp in list(_PENDING):
        _discard(tmp)
    _CLAIMS.clear()
