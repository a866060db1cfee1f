"""The input policy's shared checks: regular files only, bounded JSON, byte counts in range.

Every input kind has one reader that applies the policy (see "Input policy" in
docs/trace-format.md): the Parquet reader (``tracekit.trace.reader``), the
spool (``tracekit.record.recover``), the snapshot importer
(``tracekit.importers``), JSON side files (``load_json_file``) and option
values (``tracekit.units``). This module holds what they share. Byte counts
are at most ``MAX_BYTES`` (2^62), so that any sum of two of them, and the
rounding of one, stays inside int64; JSON is refused beyond ``MAX_JSON_BYTES``
or ``MAX_DEPTH`` levels of nesting, and ``Infinity``/``NaN`` are not numbers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shlex
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracekit.errors import InputError

MAX_BYTES = 1 << 62
MAX_JSON_BYTES = 64 << 20
MAX_DEPTH = 64


def safe_text(text: object, *, lines: bool = False) -> str:
    """``text`` safe to print on a terminal: every character that is not printable escaped as
    ``repr`` writes it (ESC -> ``\\x1b``, U+202E -> ``\\u202e``, a byte of a non-UTF-8 file name
    -> ``\\udcff``); printable text, backslashes included, unchanged. ``lines=True`` keeps
    newlines (for a block of text tracekit composed itself). For every text a trace, a file
    name or a recorded program controls: call-sites, commands, device names, paths."""
    s = str(text)
    if s.isprintable() or (lines and s.replace("\n", "").isprintable()):
        return s
    return "\n".join(_escape(part) for part in s.split("\n")) if lines else _escape(s)


def shell_word(text: str) -> str:
    """``text`` (a path) as one word a POSIX shell reads back as it is: quoted where it needs it, a
    relative path starting with ``-`` behind ``./`` (no command reads it as an option), and, as
    ``safe_text`` escapes them, the characters a terminal would act on (so a newline in a file name
    shows as ``\\n``, never as a line break)."""
    if text.startswith("-"):
        text = "./" + text
    return safe_text(shlex.quote(text))


def _escape(s: str) -> str:
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)


def plot_text(text: object) -> str:
    """``safe_text`` that matplotlib also draws literally: every ``$`` not escaped yet becomes
    ``\\$``, so a call-site, file or policy name holding ``$`` is never read as mathtext (an
    unmatched one fails the figure). Idempotent: text made literal once stays as it is."""
    return _DOLLAR.sub(r"\\$", safe_text(text, lines=True))


_DOLLAR = re.compile(r"(?<!\\)\$")


def os_cause(e: BaseException) -> str:
    """The cause of an ``OSError`` in a few words (its strerror: "Permission denied", "File name
    too long", "Too many levels of symbolic links", "No space left on device"); Arrow's own
    wording where its error carries no errno."""
    if isinstance(e, OSError) and e.errno:
        return os.strerror(e.errno)
    return str(getattr(e, "strerror", None) or e).splitlines()[0] if str(e) else type(e).__name__


def utf8_name(path: Path | str) -> str | None:
    """``path`` as text Arrow can take, or None where the name is not UTF-8 (a valid byte string on
    Linux, held by Python as surrogates that Arrow cannot encode): open the file in Python then
    and hand Arrow the open file."""
    name = str(path)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return name


def stat_or_none(path: Path | str, what: str = "input") -> os.stat_result | None:
    """``os.stat(path)``, None when nothing is there; InputError naming the path and the cause for
    every other failure (a folder one may not enter, a name too long, a symbolic-link loop, a NUL
    byte in the name). ``Path.exists`` and ``Path.is_file`` raise on some of these and hide others."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise InputError(f"{safe_text(path)}: cannot read the {what} ({os_cause(e)})") from None


def check_regular(path: Path | str, what: str = "input", *, readable: bool = False) -> os.stat_result:
    """The stat of ``path``; InputError unless it is an existing regular file (checked before opening,
    so a named pipe or a device is never opened and cannot block or stream forever), and with
    ``readable`` one this process may open to read (opened once and closed: a file of another user's
    without read permission is refused here, not by whatever reads it later)."""
    st = stat_or_none(path, what)
    if st is None:
        raise InputError(f"{safe_text(path)}: no such file")
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{safe_text(path)}: is a folder, not a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{safe_text(path)}: is not a regular file (a pipe, socket or device); "
                         f"give the {what} as a file")
    if readable:
        try:
            os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        except (OSError, ValueError) as e:
            raise InputError(f"{safe_text(path)}: cannot read the {what} ({os_cause(e)})") from None
    return st


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; ``1e999`` overflows to infinity and is refused
    like ``Infinity`` (no reader meets an infinite size, limit or device total)."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text[:40]} is not a finite number")
    return v


def load_json(text: str | bytes, where: str, what: str) -> Any:
    """Parse bounded JSON: size, nesting depth and finite numbers checked; InputError names ``what``."""
    if len(text) > MAX_JSON_BYTES:
        raise InputError(f"{where}: {what} is {len(text):,} bytes, more than the {MAX_JSON_BYTES:,} allowed")
    try:
        obj = json.loads(text, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise InputError(f"{where}: {what} is nested too deeply") from None
    except UnicodeDecodeError:
        raise InputError(f"{where}: {what} is not UTF-8 text") from None
    except ValueError as e:
        raise InputError(f"{where}: {what} is not valid JSON ({e})") from None
    if depth(obj) > MAX_DEPTH:
        raise InputError(f"{where}: {what} is nested more than {MAX_DEPTH} levels deep")
    return obj


def load_json_file(path: Path | str, what: str) -> Any:
    """``load_json`` of a file, after ``check_regular`` and the size bound."""
    st = check_regular(path, what)
    if st.st_size > MAX_JSON_BYTES:
        raise InputError(f"{path}: {what} is {st.st_size:,} bytes, more than the {MAX_JSON_BYTES:,} allowed")
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise InputError(f"{safe_text(path)}: cannot read the {what} ({os_cause(e)})") from None
    return load_json(data, str(path), what)


def depth(obj: Any) -> int:
    """Nesting depth of lists and dicts, without recursion (a hostile value cannot exhaust the stack).

    Level by level, in list comprehensions: a 3 MB metadata of a million empty objects took 20 s
    walked one value at a time with a generator, 0.5 s so (a few seconds for the largest allowed)."""
    d, level = 0, [obj]
    while level:
        containers = [o for o in level if isinstance(o, (list, dict, tuple))]
        if not containers:
            return d
        d += 1
        if d > MAX_DEPTH:
            return d
        level = [v for o in containers for v in (o.values() if isinstance(o, dict) else o)]
    return d


def byte_count(value: Any, where: str, what: str, *, allow_none: bool = True) -> int | None:
    """``value`` as a byte count in [0, MAX_BYTES), or InputError naming ``what``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{where}: {what} must be a whole number of bytes, got {str(value)[:40]!r}")
    if not 0 <= value < MAX_BYTES:
        raise InputError(f"{where}: {what} of {value} bytes is outside 0 .. 2^62")
    return value


@contextlib.contextmanager
def memory_cap(extra_bytes: int) -> Iterator[None]:
    """Within the block the process may map at most ``extra_bytes`` more (RLIMIT_AS, Linux only):
    a step whose memory a hostile input can multiply (the unpickler's memo, references) then
    fails with MemoryError, which the caller turns into one sentence, instead of exhausting
    the machine. Where the limit cannot be set, the block runs unbounded."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            mapped = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = mapped + extra_bytes
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft != resource.RLIM_INFINITY:
            cap = min(cap, soft)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def optional_int(v: Any) -> int | None:
    """``v`` as an int where it plainly is one, else None: an int (not a bool), a finite float
    (truncated), or a string of an integer. For fields a reader takes if usable (snapshot
    metadata, launcher variables, summary values); fields that must be valid are checked instead.
    """
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v == v and abs(v) < 2**63:
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None
