"""The recorder's per-event work: the frame window's hash and a ring of int64 rows in shared memory.

Two implementations of one API: the C extension ``tracekit.record._fastpath`` where it was built
(``pip install -e .`` or ``python setup.py build_ext --inplace`` on a machine with a C compiler),
and the pure-Python code here where it was not, or where ``TRACEKIT_PURE_PYTHON=1`` forces it (for
tests of both paths). ``COMPILED`` says which one the names below are.

``window_hash(skip, depth, stop) -> int``: the key of the frame window that
``tracekit.record.callstacks`` looks stacks up by. The window starts at the Python frame that calls
``window_hash``, ``skip`` frames outwards (``skip=1`` inside ``malloc_postprocess`` starts at the
frame ``sys._getframe(1)`` gives there), and holds at most ``depth`` frames, ending before the first
missing ``f_back`` or before the frame that ``is`` ``stop`` (None: no stop frame; a stop frame met
within the first ``skip`` frames does not count). Its hash is over each frame's
``(id(f_code), f_lasti)``, innermost first, and the count: equal windows give equal hashes within
one process (the code objects must stay alive, as ``LiveStacks`` keeps them, so no id is reused).
Distinct windows collide with probability about 2**-64 per pair, so n distinct windows (a program
has thousands, not billions) give about n**2 / 2**65 expected collisions; a collision would give a
request another window's stack. The two implementations give different numbers for one window
(the C one mixes with XXH64's step, this one is Python's tuple hash of the callstacks key); each
is consistent with itself, and a process uses only one. The C one costs one call plus ~10 ns a
frame; this one builds the ``2 * depth``-int tuple key (microseconds).

On CPython 3.11 a frame's ``f_lasti`` while it calls a C function (a Cython one too) moves once the
interpreter has specialised that call (it runs in PRECALL, not CALL): a window's hash, like the
tuple key before it, may change once in its first few hundred calls. That costs a second cache
entry (and one slow-path visit) for the same stack, never a wrong stack; 3.12 has no PRECALL.

``window_frames(skip, depth, stop) -> list[frame]``: the same window's frames, for the slow path
(a window never seen before). Never keep the list past the event: frames keep locals alive.

``Rows(row_ints=8)``: the recorder's waiting rows (``record.hook.EventBuffer.rows``). The C one
holds them as int64 in C memory, so a row makes no Python object: the compiled hook writes its eight
values there directly, and into the mirrored ring (``mirror(ring)``) in the same call; ``extend``
appends whole rows from Python (notes, the pools' rows); ``len`` counts ints; ``del rows[a:b]``
drops written rows; ``copy_into`` is the spool's copy (a memcpy, where packing Python ints took
~2 ns an int); ``due`` and ``cap`` are the limits the hook checks after each row. The Python one is
a list of ints with the same methods, and refuses ``mirror``.

``Ring(buffer, row_ints=8)``: writes fixed-size int64 rows (``push(*row)``) into a writable buffer,
an ``mmap.mmap`` of a file another process (the watcher) maps too, overwriting the oldest once
full; ``read_ring(buffer)`` is that process's reader. The layout (native-endian int64 words):

====================  =============================================================================
byte 0, 8 words       header: MAGIC (written last), VERSION, row_ints, nslots, HEADER_INTS (8),
                      row_ints + 1 (words per slot), 0, 0
byte 64 + 8*i*(r+1)   slot i: the row's ``r = row_ints`` words, then its marker: 0 (empty, or being
                      written) or seq + 1 (it holds row ``seq``, and ``seq % nslots == i``)
====================  =============================================================================

``nslots = (len(buffer) - 64) // (8 * (row_ints + 1))``; ``ring_bytes(nslots, row_ints)`` is the
size to make the file. A push clears the slot's marker, writes the row, then sets the marker to
seq + 1, with release barriers between (a seqlock), so a reader that copies the markers, then the
rows, then the markers again, and keeps each slot whose two marker copies agree and are nonzero,
keeps only whole rows. No lock: every call runs with the GIL held (the C code never releases it),
so pushes from several threads of the writer are serialised; one writing process per buffer.
"""

from __future__ import annotations

import functools
import mmap
import operator
import os
import struct
import sys
from collections.abc import Callable, Iterator
from itertools import accumulate, takewhile
from operator import attrgetter
from types import FrameType
from typing import Any, Protocol

import numpy as np

MAGIC = int.from_bytes(b"TKRING01", "little")
VERSION = 1
HEADER_INTS = 8  # int64 words before slot 0
MAX_ROW = 64  # the most ints a row may hold (the C writer converts a row on its stack first)
HEADER_BYTES = HEADER_INTS * 8

WritableBuffer = mmap.mmap | bytearray | memoryview


class RingWriter(Protocol):
    """What ``Ring(...)`` returns, in either implementation."""

    @property
    def seq(self) -> int: ...
    @property
    def nslots(self) -> int: ...
    @property
    def row_ints(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    def push(self, *row: int) -> None: ...
    def close(self) -> None: ...


class RowStore(Protocol):
    """What ``Rows(...)`` returns, in either implementation: the recorder's waiting rows."""

    due: int
    cap: int

    @property
    def row_ints(self) -> int: ...
    def __len__(self) -> int: ...
    def __getitem__(self, key: slice, /) -> list[int]: ...
    def __delitem__(self, key: slice, /) -> None: ...
    def extend(self, ints: tuple[int, ...] | list[int], /) -> None: ...
    def mirror(self, ring: RingWriter | None, /) -> None: ...
    def copy_into(self, buffer: WritableBuffer, offset: int, lo: int, hi: int, /) -> int: ...
    def to_bytes(self, lo: int, hi: int, /) -> bytes: ...


def ring_bytes(nslots: int, row_ints: int = 8) -> int:
    """Bytes of a ring buffer with ``nslots`` slots of ``row_ints``-int rows (the header included)."""
    return HEADER_BYTES + nslots * 8 * (row_ints + 1)


# -- the pure-Python implementation ------------------------------------------------------------

_frame_code, _frame_lasti = attrgetter("f_code"), attrgetter("f_lasti")
_steps: dict[int, tuple[str, ...]] = {}  # depth -> ("f_back",) * (depth - 1)


def _py_window(skip: int, depth: int, stop: object) -> list[FrameType]:
    """The window of ``py_window_hash``'s caller's caller (two frames up: this one, then the
    public function), with C-level iteration as ``tracekit.record.callstacks.window``."""
    if skip < 0:
        raise ValueError("skip must be >= 0")
    if depth <= 0:
        return []
    try:
        frame = sys._getframe(skip + 2)
    except ValueError:  # the stack is shorter than skip
        return []
    steps = _steps.get(depth)
    if steps is None:
        steps = _steps.setdefault(depth, ("f_back",) * (depth - 1))
    frames: Iterator[FrameType] = accumulate(steps, getattr, initial=frame)
    if stop is not None:
        frames = takewhile(functools.partial(operator.is_not, stop), frames)
    return list(takewhile(bool, frames))


def py_window_hash(skip: int, depth: int, stop: object) -> int:
    """``window_hash`` in Python: the hash of ``callstacks.window_key`` (code ids, then f_lasti)."""
    frames = _py_window(skip, depth, stop)
    return hash((*map(id, map(_frame_code, frames)), *map(_frame_lasti, frames)))


def py_window_frames(skip: int, depth: int, stop: object) -> list[FrameType]:
    """``window_frames`` in Python."""
    return _py_window(skip, depth, stop)


class PyRing:
    """``Ring`` in Python: ``struct.Struct.pack_into`` on a memoryview of the buffer (~1 µs a push,
    against ~60 ns for the C one). Same layout, same seqlock order: the marker cleared, the row, the
    marker, three separate calls so the stores happen in that order. Not atomic against a reader
    on a weakly ordered CPU (ARM): there the C writer's barriers are needed."""

    def __init__(self, buffer: WritableBuffer, row_ints: int = 8) -> None:
        if not 1 <= row_ints <= MAX_ROW:
            raise ValueError(f"row_ints must be in 1..{MAX_ROW}, not {row_ints}")
        view = memoryview(buffer).cast("B")
        if view.readonly:
            view.release()
            raise BufferError("the ring's buffer must be writable")  # as the buffer protocol says
        slot_bytes = 8 * (row_ints + 1)
        if view.nbytes < HEADER_BYTES + slot_bytes:
            view.release()
            raise ValueError(f"a ring of {row_ints}-int rows needs at least {HEADER_BYTES + slot_bytes} "
                             f"bytes, not {view.nbytes}")
        self._view: memoryview | None = view
        self._row_ints = row_ints
        self._nslots = (view.nbytes - HEADER_BYTES) // slot_bytes
        self._seq = 0
        self._slot_bytes = slot_bytes
        self._off = HEADER_BYTES  # byte offset of the slot the next push writes
        self._end = HEADER_BYTES + self._nslots * slot_bytes
        self._row = struct.Struct(f"={row_ints}q")
        self._mark = struct.Struct("=q")
        self._mark_at = 8 * row_ints  # the marker's offset inside a slot
        word = self._mark.pack_into
        word(view, 0, 0)  # magic last: a reader that sees it sees the rest
        view[HEADER_BYTES:self._end] = bytes(self._end - HEADER_BYTES)
        struct.pack_into("=7q", view, 8, VERSION, row_ints, self._nslots, HEADER_INTS, row_ints + 1, 0, 0)
        word(view, 0, MAGIC)

    @property
    def seq(self) -> int:
        """Rows pushed so far (the next row's seq)."""
        return self._seq

    @property
    def nslots(self) -> int:
        """Slots in the ring: the most rows a reader can get back."""
        return self._nslots

    @property
    def row_ints(self) -> int:
        """int64 values per row."""
        return self._row_ints

    @property
    def closed(self) -> bool:
        """The buffer was released (``close``)."""
        return self._view is None

    def push(self, *row: int) -> None:
        """Write one row (exactly ``row_ints`` ints) into slot ``seq % nslots``. A bad value raises
        TypeError or OverflowError after the slot's marker was cleared: the slot's old row (the
        oldest in the ring) is then lost, where the C writer loses nothing."""
        view = self._view
        if view is None:
            raise ValueError("push on a closed Ring")
        if len(row) != self._row_ints:
            raise TypeError(f"push takes exactly {self._row_ints} ints ({len(row)} given)")
        off = self._off
        mark = off + self._mark_at
        self._mark.pack_into(view, mark, 0)
        try:
            self._row.pack_into(view, off, *row)
        except struct.error as e:
            for v in row:
                operator.index(v)  # TypeError for a non-int, as the C writer says
            raise OverflowError(str(e)) from e
        self._mark.pack_into(view, mark, self._seq + 1)
        self._seq += 1
        off += self._slot_bytes
        self._off = off if off < self._end else HEADER_BYTES

    def close(self) -> None:
        """Release the buffer (an mmap can be closed only once no object holds it)."""
        if self._view is not None:
            self._view.release()
            self._view = None


class PyRows(list[int]):
    """``Rows`` in Python: a list of ints (a Python int per value, as before the C one) with the
    hook's limits and the spool's copy. ``mirror`` is refused: a Python-level mirror would cost about
    a microsecond a row, so a recording without the compiled helper has no tail (``record.tail``)."""

    _CHUNK = 512  # ints packed per struct call: a 4 KiB slice

    def __init__(self, row_ints: int = 8) -> None:
        super().__init__()
        if not 1 <= row_ints <= MAX_ROW:
            raise ValueError(f"row_ints must be in 1..{MAX_ROW}, not {row_ints}")
        self._row_ints = row_ints
        self.due = self.cap = sys.maxsize
        self._packs: dict[int, struct.Struct] = {}

    @property
    def row_ints(self) -> int:
        return self._row_ints

    def mirror(self, ring: RingWriter | None, /) -> None:
        if ring is not None:
            raise ValueError("rows mirror into a ring only with the compiled helper (fastpath.COMPILED)")

    def copy_into(self, buffer: WritableBuffer, offset: int, lo: int, hi: int, /) -> int:
        """Ints ``lo`` to ``hi`` as little-endian int64 into ``buffer`` at byte ``offset``."""
        at = offset
        for i in range(lo, hi, self._CHUNK):
            j = min(i + self._CHUNK, hi)
            pack = self._packs.get(j - i)
            if pack is None:
                pack = self._packs.setdefault(j - i, struct.Struct(f"<{j - i}q"))
            pack.pack_into(buffer, at, *self[i:j])
            at += (j - i) * 8
        return at - offset

    def to_bytes(self, lo: int, hi: int, /) -> bytes:
        out = bytearray((hi - lo) * 8)
        self.copy_into(out, 0, lo, hi)
        return bytes(out)


# -- which implementation -------------------------------------------------------------------------


class _RingFactory(Protocol):
    def __call__(self, buffer: WritableBuffer, row_ints: int = 8) -> RingWriter: ...


_WindowFn = Callable[[int, int, object], int]
_FramesFn = Callable[[int, int, object], list[FrameType]]

class _RowsFactory(Protocol):
    def __call__(self, row_ints: int = 8) -> RowStore: ...


window_hash: _WindowFn
window_frames: _FramesFn
Ring: _RingFactory
Rows: _RowsFactory
# The C hook callbacks (``tracekit.record.hook`` uses them where compiled; the Python callbacks there
# are the fallback); ``NATIVE_CLOCK``: ``Hook(clock=None)`` reads ``time.perf_counter_ns``'s clock.
Hook: Callable[..., Any] | None = None
NATIVE_CLOCK = False

COMPILED = False
if os.environ.get("TRACEKIT_PURE_PYTHON", "") in ("", "0"):
    try:
        import tracekit.record._fastpath as _fastpath  # the module itself: not the record package's names
    except ImportError:  # not built here (no compiler at install): the fallback below
        pass
    else:
        COMPILED = True
        window_hash, window_frames, Ring = _fastpath.window_hash, _fastpath.window_frames, _fastpath.Ring
        Rows = _fastpath.Rows
        Hook, NATIVE_CLOCK = _fastpath.Hook, bool(_fastpath.NATIVE_CLOCK)
if not COMPILED:
    window_hash, window_frames, Ring, Rows = py_window_hash, py_window_frames, PyRing, PyRows


# -- the reader (another process: the watcher) -------------------------------------------------------


def ring_header(buffer: WritableBuffer | bytes) -> tuple[int, int]:
    """(row_ints, nslots) of a ring buffer written by ``Ring``; ValueError where it holds none."""
    with memoryview(buffer) as view:
        n = view.nbytes
    if n < HEADER_BYTES:
        raise ValueError(f"a ring buffer holds at least {HEADER_BYTES} bytes, not {n}")
    head = np.frombuffer(buffer, dtype=np.int64, count=HEADER_INTS).copy()
    if int(head[0]) != MAGIC:
        raise ValueError("no ring in this buffer (bad magic: not written yet, or another byte order)")
    if int(head[1]) != VERSION:
        raise ValueError(f"ring version {int(head[1])}, this reader knows {VERSION}")
    row_ints, nslots, header, slot = (int(v) for v in head[2:6])
    if header != HEADER_INTS or slot != row_ints + 1 or nslots < 1 or \
            n < ring_bytes(nslots, row_ints):
        raise ValueError("corrupt ring header")
    return row_ints, nslots


def read_ring(buffer: WritableBuffer | bytes, since: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Every whole row in ``buffer`` whose seq is ``since`` or later, in seq order: ``(rows, seqs)``,
    an (n, row_ints) int64 array and its (n,) int64 seqs; at most ``nslots`` rows (the ring's last).

    Safe against a writer pushing meanwhile in another process (the seqlock of the module
    docstring): a slot being written, or overwritten while it was copied, is left out, so the seqs
    may have gaps where the writer lapped the reader. The copies are three numpy calls in a row, an
    order x86-64 keeps between processes; on a weakly ordered CPU (ARM) a row could in rare cases be
    torn (no read barrier between them)."""
    row_ints, nslots = ring_header(buffer)
    slot = row_ints + 1
    words = np.frombuffer(buffer, dtype=np.int64, count=HEADER_INTS + nslots * slot, offset=0)
    body = words[HEADER_INTS:].reshape(nslots, slot)
    before = body[:, row_ints].copy()
    rows = body[:, :row_ints].copy()
    after = body[:, row_ints].copy()
    del words, body  # no view left holding the buffer (an mmap cannot close while one is)
    seqs = before - 1
    ok = (before == after) & (before > 0) & (seqs % nslots == np.arange(nslots)) & (seqs >= since)
    seqs = seqs[ok]
    order = np.argsort(seqs, kind="stable")
    return rows[ok][order], seqs[order]
