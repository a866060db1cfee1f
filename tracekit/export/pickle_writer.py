"""Pickle protocol 4 written directly: builtin containers and scalars only, history entries compiled.

A PyTorch memory snapshot is one pickled dict whose ``device_traces`` hold one dict per history entry.
Building those dicts in Python would make an object per event; instead ``entries`` writes the
opcodes of each entry from NumPy columns in one compiled pass, and ``Writer`` writes the rest (the
final segments and their blocks, settings) from small builtin objects. Both share one memo
(``Memo``): a string, a frame dict or a frame list is written once, followed by ``MEMOIZE``, and
referred to after that by ``BINGET`` / ``LONG_BINGET``, as Python's pickler does for the frames
PyTorch shares between entries.

Only opcodes every reader of snapshots knows are written (Python's unpickler, tracekit's restricted
unpickler and compiled scanner, PyTorch MemoryViz's JavaScript unpickler): ``PROTO``, ``}``, ``]``,
``(``, ``u`` (SETITEMS), ``e`` (APPENDS, in batches of ``BATCH`` as Python writes them), ``t``
(TUPLE), ``K``/``M``/``J`` (BININT1/2/4), ``LONG1``, ``G`` (BINFLOAT), ``N``, ``NEWTRUE``,
``NEWFALSE``, ``SHORT_BINUNICODE``, ``X`` (BINUNICODE), ``MEMOIZE``, ``h``/``j`` (BINGET) and ``.``.
Integers take the shortest form Python's pickler takes: 0 ≤ v < 2^8 BININT1, < 2^16 BININT2,
-2^31 ≤ v < 2^31 BININT, otherwise LONG1 with the fewest little-endian two's-complement bytes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Hashable
from enum import IntEnum
from typing import Any, BinaryIO

import numpy as np
from numba import njit

BATCH = 1000  # items per APPENDS / SETITEMS, as Python's pickler batches them


class Opcode(IntEnum):
    """The pickle opcodes written here (their byte values)."""

    MARK = 0x28  # (
    STOP = 0x2E  # .
    NONE = 0x4E  # N
    BININT = 0x4A  # J
    BININT1 = 0x4B  # K
    BININT2 = 0x4D  # M
    BINFLOAT = 0x47  # G
    BINUNICODE = 0x58  # X
    EMPTY_DICT = 0x7D  # }
    EMPTY_LIST = 0x5D  # ]
    SETITEMS = 0x75  # u
    APPENDS = 0x65  # e
    TUPLE = 0x74  # t
    BINGET = 0x68  # h
    LONG_BINGET = 0x6A  # j
    PROTO = 0x80
    NEWTRUE = 0x88
    NEWFALSE = 0x89
    LONG1 = 0x8A
    SHORT_BINUNICODE = 0x8C
    MEMOIZE = 0x94


def int_bytes(v: int) -> bytes:
    """``v`` pickled in the shortest form (see the module docstring)."""
    if 0 <= v < 1 << 8:
        return bytes((Opcode.BININT1, v))
    if 0 <= v < 1 << 16:
        return bytes((Opcode.BININT2,)) + v.to_bytes(2, "little")
    if -(1 << 31) <= v < 1 << 31:
        return bytes((Opcode.BININT,)) + v.to_bytes(4, "little", signed=True)
    n = (v.bit_length() + 8) // 8  # bytes for the value and its sign bit
    if v < 0 and v >= -(1 << (8 * n - 9)):  # -2^(8k-1) needs no byte beyond its k
        n -= 1
    return bytes((Opcode.LONG1, n)) + v.to_bytes(n, "little", signed=True)


def str_bytes(s: str) -> bytes:
    """``s`` pickled (UTF-8, lone surrogates kept as Python's pickler keeps them)."""
    data = s.encode("utf-8", "surrogatepass")
    if len(data) < 256:
        return bytes((Opcode.SHORT_BINUNICODE, len(data))) + data
    return bytes((Opcode.BINUNICODE,)) + len(data).to_bytes(4, "little") + data


def get_bytes(index: int) -> bytes:
    """A reference to memo slot ``index``."""
    if index < 256:
        return bytes((Opcode.BINGET, index))
    return bytes((Opcode.LONG_BINGET,)) + index.to_bytes(4, "little")


class Memo:
    """Objects written once and referred to afterwards, as a table of items.

    Item ``i`` is either pushed by its bytes ``blob[i]``, or is a *chain* list: its first element is
    item ``head[i]`` (a blob item) and the rest are the elements of chain ``tail[i]`` (-1: none), so
    call stacks sharing their outer frames share their table rows, and each frame dict is written
    once however many stacks hold it, as PyTorch's pickles share frames. ``slot[i]`` is the item's
    memo slot once written (-1 before); ``count`` is the next slot. The compiled writer gets the
    same table as arrays (``arrays``) and hands back the slots it used (``absorb``), so Python and
    the kernel never define an object twice. A chain is written with at most ``limit`` elements
    (its first ones: a stack's innermost frames, ``tracekit.export.depth``), so what a list costs is
    bounded whatever the chain's length.
    """

    def __init__(self, limit: int = 1 << 62) -> None:
        self.limit = limit
        self.keys: dict[Hashable, int] = {}
        self.blobs: list[bytes] = []
        self.head: list[int] = []
        self.tail: list[int] = []
        self.depth: list[int] = []  # elements of a chain (0 for a blob item)
        self.slot: list[int] = []
        self.count = 0

    def _add(self, key: Hashable, blob: bytes, head: int, tail: int) -> int:
        i = self.keys.get(key)
        if i is None:
            i = self.keys[key] = len(self.blobs)
            self.blobs.append(blob)
            self.head.append(head)
            self.tail.append(tail)
            below = self.depth[tail] if tail >= 0 else 0
            self.depth.append(0 if head < 0 else min(1 + below, self.limit))
            self.slot.append(-1)
        return i

    def item(self, key: Hashable, blob: bytes) -> int:
        """The table index of ``key``, added with ``blob`` if new."""
        return self._add(key, blob, -1, -1)

    def chain(self, key: Hashable, head: int, tail: int) -> int:
        """The table index of ``key``, added if new as the list [item ``head``, *chain ``tail``]."""
        assert self.head[head] < 0 and (tail < 0 or self.head[tail] >= 0)
        return self._add(key, b"", head, tail)

    def string(self, s: str) -> int:
        return self.item(("str", s), str_bytes(s))

    def use(self, i: int) -> bytes:
        """The bytes that push item ``i``: its definition and MEMOIZE the first time, a reference after."""
        if self.slot[i] >= 0:
            return get_bytes(self.slot[i])
        if self.head[i] < 0:
            data = self.blobs[i]
        else:
            parts, j, k = [bytes((Opcode.EMPTY_LIST,))], i, 0
            while j >= 0 and k < self.limit:  # elements in batches of BATCH, as the kernel writes them
                if k % BATCH == 0:
                    parts.append(bytes((Opcode.MARK,)))
                parts.append(self.use(self.head[j]))
                k += 1
                if k % BATCH == 0:
                    parts.append(bytes((Opcode.APPENDS,)))
                j = self.tail[j]
            if k % BATCH:
                parts.append(bytes((Opcode.APPENDS,)))
            data = b"".join(parts)
        self.slot[i] = self.count
        self.count += 1
        return data + bytes((Opcode.MEMOIZE,))

    def arrays(self) -> tuple[np.ndarray, ...]:
        """(blob bytes, blob starts (len + 1), head, tail, slots, [count]) for the compiled writer."""
        starts = np.zeros(len(self.blobs) + 1, np.int64)
        np.cumsum([len(b) for b in self.blobs], out=starts[1:])
        flat = np.frombuffer(b"".join(self.blobs), np.uint8) if self.blobs else np.zeros(0, np.uint8)
        return (flat, starts, np.array(self.head, np.int64), np.array(self.tail, np.int64),
                np.array(self.slot, np.int64), np.array([self.count], np.int64))

    def blobs_bound(self) -> int:
        """Bytes the first definitions of the blob items not yet written take at most."""
        items = zip(self.blobs, self.head, self.slot, strict=True)
        return sum(len(b) + 2 for b, h, s in items if h < 0 and s < 0)

    def chain_costs(self, items: np.ndarray) -> np.ndarray:
        """Bytes the first definition of each chain item takes at most, besides its elements' blobs:
        5 per reference (LONG_BINGET), the list, its MARK/APPENDS per BATCH and MEMOIZE; 0 for a blob item
        or one already written."""
        depth = np.asarray(self.depth, np.int64)[items]
        new = (np.asarray(self.head, np.int64)[items] >= 0) & (np.asarray(self.slot, np.int64)[items] < 0)
        return np.where(new, 5 * depth + 2 * (depth // BATCH) + 8, 0)

    def absorb(self, slot: np.ndarray, count: np.ndarray) -> None:
        self.slot = [int(s) for s in slot.tolist()]
        self.count = int(count[0])


class Writer:
    """Pickle bytes to a binary file: builtins through ``obj``, raw opcodes through ``raw``.

    Strings go through the memo (written once, referred to after), or, with ``inline``, are
    written in full each time, so the bytes stand alone (the blob of a memo table item)."""

    def __init__(self, f: BinaryIO, memo: Memo, *, inline: bool = False) -> None:
        self.f = f
        self.memo = memo
        self.inline = inline
        self.buf = bytearray() if inline else bytearray((Opcode.PROTO, 4))

    def raw(self, data: bytes | bytearray | memoryview) -> None:
        self.buf += data
        if len(self.buf) >= 1 << 20:
            self.flush()

    def flush(self) -> None:
        self.f.write(self.buf)
        self.buf.clear()

    def op(self, *codes: Opcode) -> None:
        self.raw(bytes(codes))

    def ref(self, item: int) -> None:
        """Push memo table item ``item`` (defined on first use)."""
        self.raw(self.memo.use(item))

    def obj(self, o: Any) -> None:
        """Push a builtin value: dict (string keys), list, tuple, str, int, float, bool, None, or a
        ``Ref`` to a memo table item."""
        if isinstance(o, Ref):
            self.ref(o.item)
        elif o is None:
            self.op(Opcode.NONE)
        elif isinstance(o, bool):
            self.op(Opcode.NEWTRUE if o else Opcode.NEWFALSE)
        elif isinstance(o, int):
            self.raw(int_bytes(o))
        elif isinstance(o, float):
            self.raw(bytes((Opcode.BINFLOAT,)) + struct.pack(">d", o))
        elif isinstance(o, str) and self.inline:
            self.raw(str_bytes(o))
        elif isinstance(o, str):
            self.ref(self.memo.string(o))
        elif isinstance(o, dict):
            self._batches(Opcode.EMPTY_DICT, [x for kv in o.items() for x in kv], Opcode.SETITEMS, 2)
        elif isinstance(o, list):
            self._batches(Opcode.EMPTY_LIST, o, Opcode.APPENDS, 1)
        elif isinstance(o, tuple):
            self.op(Opcode.MARK)
            for v in o:
                self.obj(v)
            self.op(Opcode.TUPLE)
        else:
            raise TypeError(f"not a builtin value for a snapshot: {type(o).__name__}")

    def _batches(self, empty: Opcode, values: list[Any], closing: Opcode, per_item: int) -> None:
        """An empty container, then its values in batches of BATCH items (MARK ... closing)."""
        self.op(empty)
        step = BATCH * per_item
        for lo in range(0, len(values), step):
            self.op(Opcode.MARK)
            for v in values[lo: lo + step]:
                self.obj(v)
            self.op(closing)

    def end(self) -> None:
        self.op(Opcode.STOP)
        self.flush()


class Ref:
    """A memo table item inside a value given to ``Writer.obj``."""

    __slots__ = ("item",)

    def __init__(self, item: int) -> None:
        self.item = item


def plain_blob(o: Any) -> bytes:
    """The bytes that push ``o`` on their own: no PROTO, no memo (a memo table item's blob)."""
    out = io.BytesIO()
    w = Writer(out, Memo(), inline=True)
    w.obj(o)
    w.flush()
    return out.getvalue()


# ---- the compiled writer of history entries -------------------------------------------------

class Name(IntEnum):
    """Positions in the ``names`` array the kernel gets: memo items of keys and action strings."""

    ACTION = 0
    ADDR = 1
    SIZE = 2
    STREAM = 3
    TIME_US = 4
    FRAMES = 5
    DEVICE_FREE = 6
    COMPILE_CONTEXT = 7
    USER_METADATA = 8
    NOT_COMPILED = 9  # the value "N/A" (PyTorch's compile_context outside torch.compile)
    EMPTY = 10  # the value "" (PyTorch's user_metadata when none was set)
    KIND0 = 11  # the action string of entry kind 0; kind k is at KIND0 + k


class Kind(IntEnum):
    """History entry kinds (the kernel's codes; the strings are PyTorch's action names)."""

    ALLOC = 0
    FREE_REQUESTED = 1
    FREE_COMPLETED = 2
    SEGMENT_ALLOC = 3
    SEGMENT_FREE = 4
    OOM = 5
    SEGMENT_MAP = 6  # expandable segments: physical memory mapped into a reserved range
    SEGMENT_UNMAP = 7

    @property
    def action(self) -> str:
        return self.name.lower()


ENTRY_BOUND = 130  # bytes an entry takes at most, besides first definitions of memo items


@njit(cache=True)
def _put_get(out, pos, s):  # pragma: no cover - compiled
    """A reference to memo slot ``s``."""
    if s < 256:
        out[pos] = Opcode.BINGET
        out[pos + 1] = s
        return pos + 2
    out[pos] = Opcode.LONG_BINGET
    for b in range(4):
        out[pos + 1 + b] = (s >> (8 * b)) & 0xFF
    return pos + 5


@njit(cache=True)
def _put_blob(out, pos, i, blob, start, slot, count):  # pragma: no cover - compiled
    """Push blob item ``i``: a reference once written, else its bytes and MEMOIZE."""
    if slot[i] >= 0:
        return _put_get(out, pos, slot[i])
    a, e = start[i], start[i + 1]
    out[pos: pos + e - a] = blob[a:e]
    pos += e - a
    out[pos] = Opcode.MEMOIZE
    slot[i] = count[0]
    count[0] += 1
    return pos + 1


@njit(cache=True)
def _put_ref(out, pos, i, blob, start, head, tail, slot, count, limit):  # pragma: no cover - compiled
    """Push item ``i`` (see ``Memo``): a reference once written, else its definition (at most ``limit``
    elements) and MEMOIZE."""
    if slot[i] >= 0 or head[i] < 0:
        return _put_blob(out, pos, i, blob, start, slot, count)
    out[pos] = Opcode.EMPTY_LIST
    pos += 1
    j = i
    k = 0
    while j >= 0 and k < limit:
        if k % BATCH == 0:
            out[pos] = Opcode.MARK
            pos += 1
        pos = _put_blob(out, pos, head[j], blob, start, slot, count)
        k += 1
        if k % BATCH == 0:
            out[pos] = Opcode.APPENDS
            pos += 1
        j = tail[j]
    if k % BATCH:
        out[pos] = Opcode.APPENDS
        pos += 1
    out[pos] = Opcode.MEMOIZE
    slot[i] = count[0]
    count[0] += 1
    return pos + 1


@njit(cache=True)
def _put_u64(out, pos, v):  # pragma: no cover - compiled
    """A non-negative integer (uint64)."""
    if v < np.uint64(1 << 8):
        out[pos] = Opcode.BININT1
        out[pos + 1] = v
        return pos + 2
    if v < np.uint64(1 << 16):
        out[pos] = Opcode.BININT2
        out[pos + 1] = v & np.uint64(0xFF)
        out[pos + 2] = v >> np.uint64(8)
        return pos + 3
    if v < np.uint64(1 << 31):
        out[pos] = Opcode.BININT
        for b in range(4):
            out[pos + 1 + b] = (v >> np.uint64(8 * b)) & np.uint64(0xFF)
        return pos + 5
    n = 0
    x = v
    while x > np.uint64(0):
        n += 1
        x = x >> np.uint64(8)
    if (v >> np.uint64(8 * n - 1)) & np.uint64(1):  # the top byte's high bit would read as a sign
        n += 1
    out[pos] = Opcode.LONG1
    out[pos + 1] = n
    for b in range(min(n, 8)):
        out[pos + 2 + b] = (v >> np.uint64(8 * b)) & np.uint64(0xFF)
    if n == 9:
        out[pos + 10] = 0  # the sign byte of a value of 2^63 or more
    return pos + 2 + n


@njit(cache=True)
def _put_i64(out, pos, v):  # pragma: no cover - compiled
    """A signed integer (int64)."""
    if v >= 0:
        return _put_u64(out, pos, np.uint64(v))
    if v >= -(1 << 31):
        out[pos] = Opcode.BININT
        u = np.uint64(v + (1 << 32))
        for b in range(4):
            out[pos + 1 + b] = (u >> np.uint64(8 * b)) & np.uint64(0xFF)
        return pos + 5
    n = 5
    while n < 8 and v < -(np.int64(1) << np.int64(8 * n - 1)):
        n += 1
    out[pos] = Opcode.LONG1
    out[pos + 1] = n
    for b in range(n):
        out[pos + 2 + b] = (v >> np.int64(8 * b)) & np.int64(0xFF)
    return pos + 2 + n


@njit(cache=True)
def entries(out, kind, addr, size, stream, time_us, frames, device_free, names, blob, start, head, tail,
            slot, count, limit):  # pragma: no cover - compiled
    """Write one dict per entry into ``out`` (APPENDS batches of BATCH); returns the bytes written.

    Entry i, with the keys PyTorch 2.11 writes: ``{'action': KIND0 + kind[i], 'addr', 'size',
    'stream', 'time_us', 'compile_context': 'N/A', 'user_metadata': '', 'frames': memo item
    frames[i]}``; an OOM has ``'device_free'`` instead of ``'addr'``."""
    pos = 0
    n = kind.shape[0]
    for i in range(n):
        if i % BATCH == 0:
            out[pos] = Opcode.MARK
            pos += 1
        out[pos] = Opcode.EMPTY_DICT
        out[pos + 1] = Opcode.MARK
        pos += 2
        pos = _put_blob(out, pos, names[Name.ACTION], blob, start, slot, count)
        pos = _put_blob(out, pos, names[Name.KIND0 + kind[i]], blob, start, slot, count)
        if kind[i] == Kind.OOM:
            pos = _put_blob(out, pos, names[Name.DEVICE_FREE], blob, start, slot, count)
            pos = _put_i64(out, pos, device_free[i])
        else:
            pos = _put_blob(out, pos, names[Name.ADDR], blob, start, slot, count)
            pos = _put_u64(out, pos, addr[i])
        pos = _put_blob(out, pos, names[Name.SIZE], blob, start, slot, count)
        pos = _put_u64(out, pos, size[i])
        pos = _put_blob(out, pos, names[Name.STREAM], blob, start, slot, count)
        pos = _put_u64(out, pos, stream[i])
        pos = _put_blob(out, pos, names[Name.TIME_US], blob, start, slot, count)
        pos = _put_i64(out, pos, time_us[i])
        pos = _put_blob(out, pos, names[Name.COMPILE_CONTEXT], blob, start, slot, count)
        pos = _put_blob(out, pos, names[Name.NOT_COMPILED], blob, start, slot, count)
        pos = _put_blob(out, pos, names[Name.USER_METADATA], blob, start, slot, count)
        pos = _put_blob(out, pos, names[Name.EMPTY], blob, start, slot, count)
        pos = _put_blob(out, pos, names[Name.FRAMES], blob, start, slot, count)
        pos = _put_ref(out, pos, frames[i], blob, start, head, tail, slot, count, limit)
        out[pos] = Opcode.SETITEMS
        pos += 1
        if i % BATCH == BATCH - 1 or i == n - 1:
            out[pos] = Opcode.APPENDS
            pos += 1
    return pos


ENTRY_STRINGS = {Name.ACTION: "action", Name.ADDR: "addr", Name.SIZE: "size", Name.STREAM: "stream",
                 Name.TIME_US: "time_us", Name.FRAMES: "frames", Name.DEVICE_FREE: "device_free",
                 Name.COMPILE_CONTEXT: "compile_context", Name.USER_METADATA: "user_metadata",
                 Name.NOT_COMPILED: "N/A", Name.EMPTY: ""}


def entry_names(memo: Memo) -> np.ndarray:
    """The ``names`` array of ``entries``: the memo items of the entries' keys and fixed strings."""
    names = np.zeros(Name.KIND0 + len(Kind), np.int64)
    for pos, text in ENTRY_STRINGS.items():
        names[pos] = memo.string(text)
    for k in Kind:
        names[Name.KIND0 + k] = memo.string(k.action)
    return names


def write_entries(w: Writer, cols: dict[str, np.ndarray], names: np.ndarray) -> None:
    """Append the entries given as columns (``kind``, ``addr``, ``size``, ``stream``, ``time_us``,
    ``frames``, ``device_free``) to the list on top of ``w``'s stack."""
    n = len(cols["kind"])
    frames = cols["frames"].astype(np.int64)
    # What entry i may write: ENTRY_BOUND, plus its frame list's first definition if it is the first
    # entry here naming a list not yet written; pieces of at most PIECE_BYTES of that (one entry at
    # least), so the buffer stays bounded however many deep stacks the entries name.
    first = np.zeros(n, bool)
    first[np.unique(frames, return_index=True)[1]] = True
    cost = np.cumsum(ENTRY_BOUND + np.where(first, w.memo.chain_costs(frames), 0))
    lo = 0
    while lo < n:
        base = cost[lo - 1] if lo else 0
        hi = max(lo + 1, int(np.searchsorted(cost, base + PIECE_BYTES, "right")))
        piece = {k: v[lo:hi] for k, v in cols.items()}
        _write_piece(w, piece, names, int(cost[hi - 1] - base))
        lo = hi


PIECE_BYTES = 64 << 20  # entry bytes written per compiled pass at most (besides first blob definitions)


def _write_piece(w: Writer, cols: dict[str, np.ndarray], names: np.ndarray, bound: int) -> None:
    """One compiled pass over ``cols`` into a buffer of ``bound`` bytes plus the unwritten blobs'."""
    flat, starts, head, tail, slot, count = w.memo.arrays()
    out = np.empty(bound + w.memo.blobs_bound() + 16, np.uint8)
    end = entries(out, cols["kind"].astype(np.int64), cols["addr"].astype(np.uint64),
                  cols["size"].astype(np.uint64), cols["stream"].astype(np.uint64),
                  cols["time_us"].astype(np.int64), cols["frames"].astype(np.int64),
                  cols["device_free"].astype(np.int64), names.astype(np.int64), flat, starts, head, tail,
                  slot, count, np.int64(w.memo.limit))
    w.memo.absorb(slot, count)
    w.raw(out[:end].data)
