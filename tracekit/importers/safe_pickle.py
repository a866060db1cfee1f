"""Load a pickle that may come from anyone, without running any of its code.

A PyTorch memory snapshot is a plain pickle of builtin containers and scalars
(dict, list, tuple, str, bytes, int, float, bool, None). Unpickling can call
any importable function, so ``RestrictedUnpickler`` refuses every global
(``find_class``) and every persistent id: a file that asks for one is not a
snapshot, and loading stops before anything is called. Protocols 0 to 5 load;
gzip-compressed files are recognised by their magic bytes. Every failure
(corrupt, truncated, not a pickle, forbidden global) becomes one ``InputError``
sentence naming the file.
"""

from __future__ import annotations

import gc
import gzip
import io
import os
import pickle
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from tracekit.errors import InputError
from tracekit.inputs import check_regular, memory_cap
from tracekit.progress import LARGE_BYTES, Progress

GZIP_MAGIC = b"\x1f\x8b"
# Memory the unpickler may take: 1 GiB plus 64 bytes per byte of the file (a snapshot's
# objects take about 10 times its pickled size; gzip shrinks it about 5 times).
UNPICKLE_FREE = 1 << 30
UNPICKLE_PER_BYTE = 64


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle tried to import a name (a class or function): refused before any call."""


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that builds builtin containers only and imports nothing."""

    def find_class(self, module: str, name: str) -> Any:
        raise ForbiddenGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise ForbiddenGlobal(f"persistent id {pid!r}")


class _CountingReader(io.RawIOBase):
    """Wraps a binary file and reports how many bytes were read to a Progress."""

    def __init__(self, raw: BinaryIO, progress: Progress) -> None:
        self.raw = raw
        self.progress = progress
        self.done = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = self.raw.readinto(b)  # type: ignore[attr-defined]
        self.done += n or 0
        self.progress.update(self.done)
        return n or 0


def load_pickle(path: str | os.PathLike[str], *, progress: bool | None = None) -> Any:
    """Unpickle ``path`` (plain or gzip) with no globals allowed; returns the builtin object tree."""
    p = Path(path)
    size = check_regular(p, "snapshot").st_size  # missing files, folders and pipes end here
    try:
        raw = open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    bar = Progress("unpickling", size, enabled=size >= LARGE_BYTES if progress is None else progress)
    try:
        with raw:
            if size == 0:
                raise InputError(f"{p}: the file is empty, not a PyTorch snapshot")
            magic = raw.read(2)
            raw.seek(0)
            src: BinaryIO = io.BufferedReader(_CountingReader(raw, bar), 1 << 20)
            if magic == GZIP_MAGIC:
                src = gzip.GzipFile(fileobj=src, mode="rb")  # type: ignore[assignment]
            with memory_cap(UNPICKLE_FREE + UNPICKLE_PER_BYTE * size):
                return _unpickle(p, src)
    finally:
        bar.close()


def _unpickle(p: Path, src: BinaryIO) -> Any:
    # Millions of new containers would trigger the cyclic collector over and over on an ever larger
    # heap; a snapshot has no cycles, so collection waits until the tree is built.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return RestrictedUnpickler(src).load()
    except ForbiddenGlobal as e:
        raise InputError(
            f"{p}: refused to load: the pickle asks to import {e} (a PyTorch snapshot holds only "
            "builtin containers, so this is not one; nothing in it was run)"
        ) from None
    except EOFError:
        raise InputError(f"{p}: the file is truncated (it ends before the pickled data does)") from None
    except (gzip.BadGzipFile, zlib.error) as e:
        raise InputError(f"{p}: the gzip stream is corrupt ({e})") from None
    except MemoryError:
        raise InputError(f"{p}: loading it takes more memory than a snapshot of its size may "
                         "(1 GiB plus 64 bytes per byte of the file)") from None
    except pickle.UnpicklingError as e:
        if "truncated" in str(e):
            raise InputError(f"{p}: the file is truncated (it ends before the pickled data does)") from None
        raise InputError(f"{p}: not a valid pickle, the data is corrupt ({e})") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError,
            UnicodeDecodeError, OverflowError) as e:
        raise InputError(f"{p}: not a valid pickle ({type(e).__name__}: {e})") from None
    finally:
        if was_enabled:
            gc.enable()
