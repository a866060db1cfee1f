"""Trace format v3 (reads v1 and v2 too): the event columns, op codes and the ``tracekit`` metadata.

One Parquet file, one row per event. In memory ops are small integer codes
(``Op``); on disk they are a dictionary-encoded string column. The metadata is
one JSON object under the Parquet key ``tracekit``; ``TraceMeta`` is its typed
form and keeps unknown keys in ``extra`` so nothing a newer writer stored is
lost on a round trip. Version 3 adds the ``stack`` column and the ``tracekit.stacks`` key
(``tracekit.trace.stacks``). The optional ``environment`` key (``Environment``) holds the folders the
recording interpreter names as not the user's code. See ``docs/trace-format.md`` for the public
contract.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import IntEnum, StrEnum
from functools import cached_property
from typing import Any, TypedDict

import numpy as np
import pyarrow as pa

from tracekit.errors import TraceFormatError
from tracekit.trace.arrow import numpy_dtype
from tracekit.trace.recorded import RecordedMeta
from tracekit.trace.stacks import MAX_FRAME_TEXT_BYTES, Folders, FrameKind

SCHEMA_VERSION = 3
# A v1 trace is a v2 trace without the added columns and keys; a v2 trace a v3 trace without whole
# stacks (its call-sites read as one-frame stacks).
READABLE_VERSIONS = (1, 2, 3)
META_KEY = b"tracekit"


class Op(IntEnum):
    """Event kinds; the integer is the in-memory code, the name the on-disk string."""

    MALLOC = 0
    FREE = 1
    SEGMENT_ALLOC = 2
    SEGMENT_FREE = 3
    OOM = 4

    @property
    def label(self) -> str:
        return self.name.lower()


OP_NAMES: tuple[str, ...] = tuple(op.label for op in Op)


def op_codes(names: Sequence[str | None]) -> np.ndarray:
    """The ``Op`` code of each on-disk op name (int8), -1 for a name the format does not have: the
    look-up table of an ``op`` column's dictionary."""
    return np.array([OP_NAMES.index(s) if s in OP_NAMES else -1 for s in names], np.int8)


class Source(StrEnum):
    """Where a trace came from."""

    CUPY = "cupy"
    TORCH = "torch"
    SYNTHETIC = "synthetic"
    REPLAY = "replay"
    RMM = "rmm"  # an RMM allocation log (``import rmm``)


# Required columns, their Arrow types on write, and the kind checked on read.
COLUMNS: tuple[tuple[str, pa.DataType, bool], ...] = (
    ("seq", pa.uint64(), False),
    ("t_ns", pa.int64(), False),
    ("op", pa.dictionary(pa.int8(), pa.string()), False),
    ("addr", pa.uint64(), True),
    ("size", pa.uint64(), False),
    ("rounded", pa.uint64(), True),
    ("stream", pa.uint64(), False),
    ("device", pa.int16(), False),
    ("site", pa.dictionary(pa.int32(), pa.string()), True),
)
REQUIRED = tuple(name for name, _, _ in COLUMNS)  # all but ``site`` must be present on read
# The integer columns by their NumPy types: what the reader hands over (another integer type in a
# file is converted to these, each value checked to fit).
INT_COLUMNS: Mapping[str, type] = {name: numpy_dtype(t).type for name, t, _ in COLUMNS
                                   if pa.types.is_integer(t)}
# Version 3's stack id per event (null: none), after the v1 columns; optional on read.
STACK_FIELD = pa.field("stack", pa.int32(), nullable=True)


def arrow_schema(meta: TraceMeta, extra_fields: tuple[pa.Field, ...] = ()) -> pa.Schema:
    """The Arrow schema of a trace; writers always write the current version (a read v1 is upgraded):
    the v1 columns, ``stack``, then ``extra_fields``. An extra field named ``stack`` (the format-2
    text column of ``import torch --stacks``) takes the place of the v3 one."""
    fields = [pa.field(n, t, nullable=nl) for n, t, nl in COLUMNS]
    if all(f.name != STACK_FIELD.name for f in extra_fields):
        fields.append(STACK_FIELD)
    meta = replace(meta, schema_version=SCHEMA_VERSION)
    return pa.schema(fields + list(extra_fields), metadata={META_KEY: meta.to_json().encode()})


@dataclass(frozen=True)
class DeviceInfo:
    """The device a trace was recorded on (or replayed for); bytes are exact."""

    name: str | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "total_bytes": self.total_bytes, "free_bytes": self.free_bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceInfo:
        return cls(
            d.get("name"),
            _opt_int(d.get("total_bytes"), "device.total_bytes"),
            _opt_int(d.get("free_bytes"), "device.free_bytes"),
        )


class EnvironmentJSON(TypedDict):
    """The ``environment`` metadata key: where the recording interpreter keeps code that is not the
    user's, each folder absolute (and again with symbolic links resolved where that differs)."""

    prefix: str  # sys.prefix
    base_prefix: str  # sys.base_prefix
    stdlib: list[str]  # sysconfig's stdlib and platstdlib
    site_packages: list[str]  # site.getsitepackages(), getusersitepackages(), purelib/platlib, sys.path's
    libraries: list[str]  # the array library's package folders (cupy's, torch's, ...)
    tracekit: list[str]  # tracekit's own package folder
    venvs: list[str]  # virtualenvs (a folder holding pyvenv.cfg) inside the user's folders
    user: list[str]  # the working directory and the program's folder: the user's


MAX_FOLDERS = 4096  # folders per list of ``environment`` a reader takes


@dataclass(frozen=True)
class Environment:
    """``EnvironmentJSON`` read once: what ``tracekit.trace.stacks.frame_kind`` asks (``folders``).

    Why the interpreter's word and not names alone: a library in a folder not named site-packages (a
    ``.venv`` inside the project, a checkout on ``PYTHONPATH``, a vendor folder), the program's folder
    inside ``sys.prefix`` (a container's ``/usr/local/app``), and paths the trace stores relative to
    its roots all read wrong by name."""

    prefix: str = ""
    base_prefix: str = ""
    stdlib: tuple[str, ...] = ()
    site_packages: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    tracekit: tuple[str, ...] = ()
    venvs: tuple[str, ...] = ()
    user: tuple[str, ...] = ()

    def folders(self) -> Folders:
        """The folders in the order ``frame_kind`` asks them (the first holding a path decides).

        First those that are never the user's, the most specific first: the standard library
        (``STDLIB``), then site-packages, the array library, tracekit, a virtualenv inside the
        project (``LIBRARY``), even where the program's folder or the working directory holds them.
        Then the user's folders and ``sys.prefix``/``sys.base_prefix`` together, the most specific
        first, a user's folder before a prefix of equal length: a program in ``/proj`` with its
        ``.venv`` (the prefix) inside is the user's, its ``.venv/bin`` not; a program in
        ``/usr/local/app`` under the prefix ``/usr/local`` is the user's too. The filesystem root and
        relative folders are left out (they would hold everything, or nothing absolute)."""
        strong = [(f, FrameKind.STDLIB) for f in self.stdlib]
        strong += [(f, FrameKind.LIBRARY) for f in (*self.site_packages, *self.libraries, *self.tracekit,
                                                     *self.venvs)]
        weak = [(f, FrameKind.USER) for f in self.user]
        weak += [(f, FrameKind.LIBRARY) for f in (self.prefix, self.base_prefix)]
        out: list[tuple[str, FrameKind]] = []
        seen: set[str] = set()
        for group in (strong, weak):
            group = [(_with_sep(f), k) for f, k in group if f.startswith("/") and f.strip("/")]
            for folder, kind in sorted(group, key=lambda fk: (-len(fk[0]), fk[1] is not FrameKind.USER)):
                if folder not in seen:
                    seen.add(folder)
                    out.append((folder, kind))
        return tuple(out)

    def to_json(self) -> EnvironmentJSON:
        return EnvironmentJSON(prefix=self.prefix, base_prefix=self.base_prefix, stdlib=list(self.stdlib),
                               site_packages=list(self.site_packages), libraries=list(self.libraries),
                               tracekit=list(self.tracekit), venvs=list(self.venvs), user=list(self.user))

    @classmethod
    def from_json(cls, obj: object) -> Environment:
        """Every field checked (ValueError naming it); keys a newer writer added are ignored, missing
        ones read as empty."""
        if not isinstance(obj, dict):
            raise ValueError("environment must be an object")
        return cls(_text(obj, "prefix"), _text(obj, "base_prefix"), _texts(obj, "stdlib"),
                   _texts(obj, "site_packages"), _texts(obj, "libraries"), _texts(obj, "tracekit"),
                   _texts(obj, "venvs"), _texts(obj, "user"))


def _with_sep(folder: str) -> str:
    return folder.rstrip("/") + "/"


def _text(obj: Mapping[str, Any], key: str) -> str:
    v = obj.get(key)
    if v is None:
        return ""
    if not isinstance(v, str) or len(v.encode("utf-8", "surrogatepass")) > MAX_FRAME_TEXT_BYTES:
        raise ValueError(f"environment.{key} must be a folder name, got {type(v).__name__}")
    return v


def _texts(obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    v = obj.get(key)
    if v is None:
        return ()
    if not isinstance(v, list) or len(v) > MAX_FOLDERS:
        raise ValueError(f"environment.{key} must be a list of at most {MAX_FOLDERS} folders")
    for x in v:
        if not isinstance(x, str) or len(x.encode("utf-8", "surrogatepass")) > MAX_FRAME_TEXT_BYTES:
            raise ValueError(f"environment.{key} must hold folder names")
    return tuple(v)


@dataclass(frozen=True)
class TraceMeta:
    """The ``tracekit`` metadata object. Only ``source`` is required on read."""

    source: Source
    schema_version: int = SCHEMA_VERSION
    created_utc: str | None = None
    device: DeviceInfo | None = None
    pool_limit_bytes: int | None = None
    command: str | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    environment: Environment | None = None  # the ``environment`` key, where the recorder stored one
    extra: Mapping[str, Any] = field(default_factory=dict)

    @cached_property
    def recorded(self) -> RecordedMeta:
        """The recorder's keys of ``extra``, typed (``tracekit.trace.recorded``): parsed on first use,
        once per metadata object (a ``with_extra`` copy parses its own)."""
        return RecordedMeta.from_extra(self.extra)

    @classmethod
    def new(cls, source: Source, **kw: Any) -> TraceMeta:
        """Metadata for a trace being written now (``created_utc`` filled in)."""
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return cls(source=source, created_utc=now, **kw)

    def with_extra(self, **kw: Any) -> TraceMeta:
        return replace(self, extra={**self.extra, **kw})

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "schema_version": self.schema_version,
            "source": self.source.value,
            "created_utc": self.created_utc,
            "device": self.device.to_dict() if self.device else None,
            "pool_limit_bytes": self.pool_limit_bytes,
            "command": self.command,
            "versions": dict(self.versions),
        }
        if self.environment is not None:
            d["environment"] = self.environment.to_json()
        d.update(self.extra)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=False, default=str)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> TraceMeta:
        try:
            d = json.loads(text)
        except ValueError as e:
            raise TraceFormatError(f"{where}: the 'tracekit' metadata is not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise TraceFormatError(f"{where}: the 'tracekit' metadata is not a JSON object")
        return cls.from_dict(d, where)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> TraceMeta:
        try:
            return cls._from_dict(d, where)
        except (TypeError, ValueError) as e:
            raise TraceFormatError(f"{where}: the 'tracekit' metadata has a malformed value ({e})") from None

    @classmethod
    def _from_dict(cls, d: Mapping[str, Any], where: str) -> TraceMeta:
        version = d.get("schema_version")
        if version is None:
            raise TraceFormatError(f"{where}: the 'tracekit' metadata has no schema_version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise TraceFormatError(
                f"{where}: unsupported schema_version {version!r} (this tracekit reads versions 1, 2 and 3)"
            )
        src = d.get("source")
        try:
            source = Source(str(src))
        except ValueError:
            raise TraceFormatError(
                f"{where}: unknown source {src!r} in metadata "
                f"(expected one of {', '.join(s.value for s in Source)})"
            ) from None
        dev = d.get("device")
        known = {"schema_version", "source", "created_utc", "device", "pool_limit_bytes",
                 "command", "versions", "environment"}
        env = d.get("environment")
        cmd = d.get("command")
        return cls(
            source=source,
            schema_version=version,
            created_utc=d.get("created_utc"),
            device=DeviceInfo.from_dict(dev) if isinstance(dev, dict) else None,
            pool_limit_bytes=_opt_int(d.get("pool_limit_bytes"), "pool_limit_bytes"),
            command=" ".join(map(str, cmd)) if isinstance(cmd, list) else cmd,
            versions=_versions(d.get("versions")),
            environment=Environment.from_json(env) if env is not None else None,
            extra={k: v for k, v in d.items() if k not in known},
        )


def _opt_int(v: Any, key: str = "") -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v != int(v):
        raise ValueError(f"{key or 'a size'} must be an integer, got {v!r}")
    return int(v)


def _versions(v: Any) -> dict[str, str]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ValueError(f"versions must be an object, got {type(v).__name__}")
    return {str(k): str(x) for k, x in v.items()}
