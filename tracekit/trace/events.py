"""Events as NumPy columns: the in-memory form of a trace that every stage shares.

No Python object per event: each field is one NumPy array of length n, and
call-sites are an int32 index into a small tuple of ``path:line:function``
strings (-1 = none), whole call stacks an int32 index into a ``StackTable``
(``tracekit.trace.stacks``; -1 = none). Nullable on-disk columns use a zero filler here; which
rows are null follows from the op (``addr`` is null only for ``oom``,
``rounded`` only for rows that are neither ``malloc`` nor ``oom``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from tracekit.trace.schema import Op
from tracekit.trace.stacks import StackTable, merge

FIELDS: tuple[tuple[str, type], ...] = (
    ("seq", np.uint64),
    ("t_ns", np.int64),
    ("op", np.int8),
    ("addr", np.uint64),
    ("size", np.uint64),
    ("rounded", np.uint64),
    ("stream", np.uint64),
    ("device", np.int16),
    ("site", np.int32),
    ("stack", np.int32),
)

@functools.lru_cache(maxsize=16)
def site_stacks(sites: tuple[str, ...]) -> StackTable:
    """``StackTable.from_sites(sites)``, one object per distinct dictionary: the batches of one trace
    built from one call-site tuple share their table, so concat and the writer remap nothing."""
    return StackTable.from_sites(sites)


# The defaults of Events.stack/stacks, told apart by identity: "not given" (see Events).
_UNSET = np.full(0, -1, np.int32)
_FROM_SITES = StackTable.empty()


@dataclass(frozen=True, eq=False)
class Events:
    """n events as parallel read-only arrays; ``sites`` is the call-site dictionary, ``stacks`` the
    table that ``stack`` indexes (``stacks.frames(int(stack[i]))``: event i's frames, innermost first).

    A producer that gives neither ``stack`` nor ``stacks`` gets its call-sites as one-frame stacks:
    ``stack`` = ``site``, ``stacks`` = ``StackTable.from_sites(sites)`` (formats 1 and 2). ``stacks``
    without ``stack``: no event has a stack. ``stack`` without ``stacks`` is refused (ids of nothing).
    """

    seq: np.ndarray
    t_ns: np.ndarray
    op: np.ndarray
    addr: np.ndarray
    size: np.ndarray
    rounded: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    site: np.ndarray
    sites: tuple[str, ...] = ()
    stack: np.ndarray = field(default_factory=lambda: _UNSET)  # int32 per event
    stacks: StackTable = _FROM_SITES

    def __post_init__(self) -> None:
        n = len(self.seq)
        if self.stacks is _FROM_SITES:
            if self.stack is not _UNSET:
                raise ValueError("Events.stack given without the StackTable it indexes (Events.stacks)")
            object.__setattr__(self, "stack", self.site)
            object.__setattr__(self, "stacks", site_stacks(self.sites))
        elif self.stack is _UNSET:
            object.__setattr__(self, "stack", np.full(n, -1, np.int32))
        for name, dtype in FIELDS:
            arr = getattr(self, name)
            if arr.dtype != dtype or arr.ndim != 1 or len(arr) != n:
                raise ValueError(f"Events.{name}: expected 1-D {np.dtype(dtype)} of length {n}")
            if arr.flags.writeable:
                # Events never change; and numba compiles a kernel once per writability, so
                # columns read zero-copy from one row group (read-only), concatenated from several
                # or built in memory (writable) would each need their own compiled kernels. One
                # kind, read-only views, keeps every verb on the kernels the install compiled.
                view = arr.view()
                view.flags.writeable = False
                object.__setattr__(self, name, view)

    def __len__(self) -> int:
        return len(self.seq)

    def __reduce__(self) -> tuple[type[Events], tuple[object, ...]]:
        # Through __init__, so columns sent to a worker process arrive read-only too.
        return (Events, (*(getattr(self, name) for name, _ in FIELDS[:-1]), self.sites, self.stack,
                         self.stacks))

    @classmethod
    def build(
        cls,
        op: np.ndarray,
        size: np.ndarray,
        *,
        addr: np.ndarray | None = None,
        rounded: np.ndarray | None = None,
        t_ns: np.ndarray | None = None,
        seq: np.ndarray | None = None,
        stream: np.ndarray | None = None,
        device: np.ndarray | None = None,
        site: np.ndarray | None = None,
        sites: tuple[str, ...] = (),
        stack: np.ndarray | None = None,
        stacks: StackTable | None = None,
    ) -> Events:
        """Events from whatever columns are at hand; missing ones get defaults.

        Defaults: ``seq`` = 0..n-1, ``t_ns`` = seq, ``addr``/``rounded`` = 0,
        ``stream``/``device`` = 0, ``site`` = -1 (none); ``stack``/``stacks`` as the class says.
        Raises ValueError when a ``stack`` id is outside -1 .. ``stacks.n_stacks`` - 1.
        """
        n = len(op)
        ar = np.arange(n, dtype=np.uint64)

        def col(a: np.ndarray | None, dtype: type, default: np.ndarray | int) -> np.ndarray:
            if a is None:
                if isinstance(default, np.ndarray):
                    return default.astype(dtype, copy=False)
                return np.full(n, default, dtype=dtype)
            return np.ascontiguousarray(a, dtype=dtype)

        return cls(
            seq=col(seq, np.uint64, ar),
            t_ns=col(t_ns, np.int64, ar),
            op=col(op, np.int8, 0),
            addr=col(addr, np.uint64, 0),
            size=col(size, np.uint64, 0),
            rounded=col(rounded, np.uint64, 0),
            stream=col(stream, np.uint64, 0),
            device=col(device, np.int16, 0),
            site=col(site, np.int32, -1),
            sites=tuple(sites),
            stack=_UNSET if stack is None else np.ascontiguousarray(stack, dtype=np.int32),
            stacks=_FROM_SITES if stacks is None else stacks,
        ).checked()

    def checked(self) -> Events:
        """``self``, or ValueError when a ``stack`` id is not a stack of ``stacks`` (nor -1)."""
        ids = self.stack
        if len(ids) and (int(ids.min()) < -1 or int(ids.max()) >= self.stacks.n_stacks):
            raise ValueError(f"Events.stack holds ids outside -1 .. {self.stacks.n_stacks - 1}")
        return self

    def take(self, index: np.ndarray | slice) -> Events:
        """The events selected by a mask, an index array or a slice (a view), in order."""
        return Events(**{name: getattr(self, name)[index] for name, _ in FIELDS}, sites=self.sites,
                      stacks=self.stacks)

    @classmethod
    def concat(cls, parts: list[Events]) -> Events:
        """Join event batches; call-site dictionaries and stack tables are merged, ids remapped."""
        if not parts:
            return cls.build(np.zeros(0, np.int8), np.zeros(0, np.uint64))
        sites: dict[str, int] = {}
        remapped = []
        for p in parts:
            lut = np.array([sites.setdefault(s, len(sites)) for s in p.sites] + [-1], dtype=np.int32)
            remapped.append(lut[p.site])  # index -1 picks the trailing -1
        cols = {name: np.concatenate([getattr(p, name) for p in parts]) for name, _ in FIELDS}
        cols["site"] = np.concatenate(remapped)
        table, luts = merge([p.stacks for p in parts])
        cols["stack"] = np.concatenate([lut[p.stack] for p, lut in zip(parts, luts, strict=True)])
        return cls(**cols, sites=tuple(sites), stacks=table)

    def count(self, op: Op) -> int:
        return int(np.count_nonzero(self.op == op))

    def site_name(self, i: int) -> str | None:
        s = int(self.site[i])
        return self.sites[s] if s >= 0 else None


def seq_row(seq_col: np.ndarray, seq: int) -> int:
    """The first row of an ascending seq column whose seq is at least ``seq`` (its length: none).
    The key is given in the column's own type: with a Python int NumPy casts every row first
    (22 ms at 10M events; under NumPy 1, to float, inexact above 2^53)."""
    return int(np.searchsorted(seq_col, seq_col.dtype.type(seq)))


def segment_delta(ev: Events) -> np.ndarray:
    """Bytes each row adds to what the pools hold from the device (int64): + size for a
    ``segment_alloc``, - size for a ``segment_free``, 0 for every other row."""
    size = ev.size.astype(np.int64)
    return np.where(ev.op == Op.SEGMENT_ALLOC, size, np.where(ev.op == Op.SEGMENT_FREE, -size, 0))


def reserved_through(ev: Events, row: int) -> int:
    """Bytes the pools held from the device after ``row`` (``segment_delta`` summed to it)."""
    return int(segment_delta(ev)[: row + 1].sum())
