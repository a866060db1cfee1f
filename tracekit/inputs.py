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
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracekit.errors import InputError

MAX_BYTES = 1 << 62
MAX_JSON_BYTES = 64 << 20
MAX_DEPTH = 64


def check_regular(path: Path | str, what: str = "input") -> os.stat_result:
    """The stat of ``path``; InputError unless it is an existing regular file (checked before opening,
    so a named pipe or a device is never opened and cannot block or stream forever)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read the {what} ({getattr(e, 'strerror', None) or e})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a folder, not a {what} file")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: is not a regular file (a pipe, socket or device); "
                         f"give the {what} as a file")
    return st


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number here")


def load_json(text: str | bytes, where: str, what: str) -> Any:
    """Parse bounded JSON: size, nesting depth and finite numbers checked; InputError names ``what``."""
    if len(text) > MAX_JSON_BYTES:
        raise InputError(f"{where}: {what} is {len(text):,} bytes, more than the {MAX_JSON_BYTES:,} allowed")
    try:
        obj = json.loads(text, parse_constant=_no_constant)
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
        raise InputError(f"{path}: cannot read the {what} ({e.strerror or e})") from None
    return load_json(data, str(path), what)


def depth(obj: Any) -> int:
    """Nesting depth of lists and dicts, without recursion (a hostile value cannot exhaust the stack)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            o = list(o.values())
        if isinstance(o, list | tuple):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            stack.extend((v, d + 1) for v in o)
    return deepest


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
