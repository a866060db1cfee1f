"""Call-sites: the innermost Python frame outside the skipped libraries, as a small integer.

The recorder asks for a call-site on every malloc (and out-of-memory), so the lookup must
cost next to nothing: whether a code object belongs to a skipped library
(CuPy, tracekit) is decided once per code object, and the site of a frame is
cached by ``(code object, instruction offset)``, with code objects keyed by
``id()``: hashing a code object hashes its bytecode and constants on every
lookup, which alone costs microseconds (the table keeps each code object it
has seen alive, so an id is never reused). Only a cache miss computes
the line number and the ``path:line:function`` string; equal strings share
one id. Ids are dense, start at 0 and never change, so a batch of events can
be written before later sites exist. ``-1`` means no frame outside the
skipped libraries was found. Paths are stored relative to the first of
``roots`` that holds them (the working directory, then the program's
folder, then the library folders: site-packages, the standard library), so
a trace names ``train.py`` or ``torchvision/models/resnet.py``, not a home
folder or a virtualenv; a file outside every root keeps its absolute path.
"""

from __future__ import annotations

import contextlib
import os
import threading
from types import CodeType, FrameType

from tracekit.trace.stacks import MAX_FRAME_TEXT_BYTES as MAX_SITE_TEXT  # the reader's bound on a site
from tracekit.trace.stacks import cut_text


class SiteTable:
    """Maps frames to site ids; ``names`` holds the ``path:line:function`` string of each id."""

    def __init__(self, skip_dirs: tuple[str, ...] = (), roots: tuple[str, ...] = ()) -> None:
        # A trailing separator so /x/cupy does not also skip /x/cupy_extras.
        self._prefixes = tuple(os.path.join(os.path.abspath(d), "") for d in skip_dirs)
        self.roots = roots
        self.internal: dict[int, bool] = {}  # id(code) -> inside a skipped library
        self.by_offset: dict[tuple[int, int], int] = {}  # (id(code), f_lasti) -> site id
        self._codes: list[CodeType] = []  # keeps every code seen alive, so ids stay unique
        self.names: list[str] = []
        self._by_name: dict[str, int] = {}
        self._lock = threading.Lock()

    def is_internal(self, code: CodeType) -> bool:
        flag = self.internal.get(id(code))
        if flag is None:
            name = code.co_filename
            flag = bool(self._prefixes) and os.path.abspath(name).startswith(self._prefixes)
            with self._lock:
                self._codes.append(code)
                self.internal[id(code)] = flag
        return flag

    def site_of(self, frame: FrameType | None) -> int:
        """The site id of the innermost frame at or above ``frame`` outside the skipped libraries."""
        internal = self.internal
        while frame is not None:
            code = frame.f_code
            flag = internal.get(id(code))
            if flag is None:
                flag = self.is_internal(code)
            if not flag:
                site = self.by_offset.get((id(code), frame.f_lasti))
                return self.add(frame) if site is None else site
            frame = frame.f_back
        return -1

    def add(self, frame: FrameType) -> int:
        """Slow path: name the frame's line and give it an id (shared by equal names)."""
        code = frame.f_code
        path = relative_path(code.co_filename, self.roots)
        function = getattr(code, "co_qualname", code.co_name)
        name = cut_text(f"{path}:{frame.f_lineno}:{function}", MAX_SITE_TEXT)
        with self._lock:  # two threads may miss on the same line at once
            site = self._by_name.get(name)
            if site is None:
                site = self._by_name[name] = len(self.names)
                self.names.append(name)
            self._codes.append(code)
            self.by_offset[(id(code), frame.f_lasti)] = site
        return site

    def names_since(self, start: int) -> list[str]:
        """The names of ids ``start``, ``start+1``, ... known now."""
        return self.names[start:]


def relative_path(path: str, roots: tuple[str, ...]) -> str:
    """``path`` relative to the first root holding it (``<string>``-style names are kept)."""
    if not os.path.isabs(path):
        return path
    for root in roots:
        prefix = os.path.join(os.path.abspath(root), "")
        if path.startswith(prefix):
            return path[len(prefix):]
    return path


def relative_site(name: str, roots: tuple[str, ...]) -> str:
    """A ``path:line:function`` site with its path made relative (see ``relative_path``)."""
    parts = name.rsplit(":", 2)
    if len(parts) != 3:
        return name
    return f"{relative_path(parts[0], roots)}:{parts[1]}:{parts[2]}"


def site_roots(program: str | None) -> tuple[str, ...]:
    """The working directory, the program's folder (a script's; none for ``-m``), the library folders."""
    roots = [os.getcwd()]
    if program is not None:  # the script's path as given and as sys.path[0] resolves it
        for folder in (os.path.dirname(os.path.abspath(program)), os.path.dirname(os.path.realpath(program))):
            if folder not in roots:
                roots.append(folder)
    for folder in library_roots():
        if folder not in roots:
            roots.append(folder)
    return tuple(roots)


def library_roots() -> list[str]:
    """Where installed packages and the standard library live, the most specific folder first."""
    import site
    import sysconfig

    found = {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    with contextlib.suppress(AttributeError):  # site helpers are missing in some embedded interpreters
        found.update(site.getsitepackages())
        found.add(site.getusersitepackages())
    return sorted((os.path.abspath(f) for f in found if f), key=len, reverse=True)


CUPY_PACKAGES = ("cupy", "cupyx", "cupy_backends", "fastrlock")  # CuPy's import packages, by folder


def default_skip_dirs() -> tuple[str, ...]:
    """Package folders whose frames are never a call-site: tracekit itself and CuPy's packages."""
    import importlib.util

    dirs = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    for pkg in CUPY_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(spec.submodule_search_locations)
    return tuple(dirs)


def exception_site(exc: BaseException | None, skip_dirs: tuple[str, ...],
                   roots: tuple[str, ...]) -> str | None:
    """``path:line:function`` of the innermost frame of ``exc``'s traceback outside ``skip_dirs``
    (and outside Python's frozen modules), relative as ``relative_path`` makes it; None if none."""
    prefixes = tuple(os.path.join(os.path.abspath(d), "") for d in skip_dirs)
    tb = exc.__traceback__ if exc is not None else None
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename
        if not name.startswith("<frozen") and not (prefixes and os.path.abspath(name).startswith(prefixes)):
            function = getattr(code, "co_qualname", code.co_name)
            found = cut_text(f"{relative_path(name, roots)}:{tb.tb_lineno}:{function}", MAX_SITE_TEXT)
        tb = tb.tb_next
    return found
