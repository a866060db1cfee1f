"""The allocation hook: CuPy's MemoryHook callbacks turned into raw integer rows.

Every event is one atomic ``list.extend`` of six ints onto a flat list
(``EventBuffer``): ``t``, ``code``, ``addr``, ``size``, ``rounded``,
``stream``, where ``code = (site + 1) << 20 | device << 4 | op``. One C call
per event keeps the hook cheap and makes it safe from any thread (a row is
never torn), and the writer turns the list into NumPy columns once per batch,
so no Python object outlives a batch. CuPy calls six callbacks per
malloc/free pair with keyword arguments; the four the recorder does not need
are bound to ``dict`` (a C call, cheaper than a no-op Python method) and the
two it needs are closures whose parameters are named, so CPython binds the
keywords without building a dict. Call-sites are captured for malloc and
oom rows only: a free belongs to the block its malloc made (readers pair
them), and a frame lookup at every free would double the cost. ``op`` 15 marks a note row: ``addr`` is the
index of a JSON-able dict in ``EventBuffer.notes`` describing the event
written just before it (the pool's state at an out-of-memory error).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tracekit.record.sites import SiteTable
from tracekit.trace.schema import Op

ROW = 6  # ints per event
NOTE = 15  # op code of a note row
SITE_SHIFT = 20
DEVICE_SHIFT = 4

MALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM = (int(op) for op in Op)


class EventBuffer:
    """The flat list all threads append rows to, and the notes rows point at."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.extend = self.rows.extend
        self.notes: list[dict[str, Any]] = []
        self.taken = 0  # rows handed to the writer so far

    def take(self) -> np.ndarray:
        """Remove and return the rows so far as an (n, 6) int64 array (safe against appenders)."""
        rows = self.rows
        n = len(rows)  # always a multiple of ROW: each extend is one atomic call
        chunk = rows[:n]
        del rows[:n]  # appends land past n, so this removes exactly the rows taken
        self.taken += n // ROW
        return np.array(chunk, dtype=np.int64).reshape(-1, ROW)

    def note(self, row: tuple[int, ...], note: dict[str, Any], clock: Callable[[], int]) -> None:
        """Append an event row and, in the same atomic extend, the note row describing it."""
        self.notes.append(note)
        self.extend((*row, clock(), NOTE, len(self.notes) - 1, 0, 0, 0))


def unpack(raw: np.ndarray) -> dict[str, np.ndarray]:
    """Split an (n, 6) raw row array into named columns (op, device and site from ``code``)."""
    code = raw[:, 1]
    return {
        "t": raw[:, 0],
        "op": (code & 15).astype(np.int8),
        "device": ((code >> DEVICE_SHIFT) & 0xFFFF).astype(np.int16),
        "site": ((code >> SITE_SHIFT) - 1).astype(np.int32),
        "addr": raw[:, 2],
        "size": raw[:, 3],
        "rounded": raw[:, 4],
        "stream": raw[:, 5],
    }


class TraceHook:
    """CuPy memory-hook callbacks that log malloc, free and failed (out-of-memory) requests.

    ``current_stream`` is ``cupy.cuda.get_current_stream`` (anything returning an
    object with ``.ptr``); ``pool_state(device_id)`` returns the pool's figures
    for the note written with an out-of-memory row. ``sites=None`` records no
    call-sites. Use ``cupy_hook`` to get the registrable MemoryHook subclass.
    """

    name = "tracekit"

    def __init__(
        self,
        buffer: EventBuffer,
        *,
        sites: SiteTable | None,
        current_stream: Callable[[], Any],
        pool_state: Callable[[int], dict[str, Any]] = lambda device_id: {},
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self.buffer = buffer
        self.sites = sites
        self._pool_state = pool_state
        self._clock = clock
        self._stream = current_stream
        self.alloc_preprocess = self.alloc_postprocess = dict
        self.malloc_preprocess = self.free_preprocess = dict
        self.malloc_postprocess, self.free_postprocess = (
            _callbacks(buffer.extend, clock, current_stream, self._failed)
            if sites is None
            else _site_callbacks(buffer.extend, clock, current_stream, self._failed, sites)
        )

    def _failed(self, device_id: int, size: int, mem_size: int, site: int) -> None:
        """A malloc returned no memory: log an ``oom`` row if the pending exception is a MemoryError."""
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, MemoryError):
            return  # another error (a CUDA fault, an interrupt): not an out-of-memory request
        try:
            state = dict(self._pool_state(device_id))
        except Exception as e:  # the pool could not answer; keep the row anyway
            state = {"pool_state_error": f"{type(e).__name__}: {e}"}
        note = {
            "kind": "oom", "device": device_id, "size": size, "rounded": mem_size,
            "exception": None if exc is None else type(exc).__name__,
            "message": None if exc is None else str(exc), **state,
        }
        code = ((site + 1) << SITE_SHIFT) | (device_id << DEVICE_SHIFT) | OOM
        row = (self._clock(), code, 0, size, mem_size, self._stream().ptr)
        self.buffer.note(row, note, self._clock)


# The row-code constants are bound as parameter defaults: locals cost no global lookup per event.
def _callbacks(ext, clock, stream, failed):  # type: ignore[no-untyped-def]
    def malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                           _dev=DEVICE_SHIFT):
        if mem_ptr:
            ext((clock(), device_id << _dev, mem_ptr, size, mem_size, stream().ptr))
        elif size:
            failed(device_id, size, mem_size, -1)

    def free_postprocess(device_id, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                         _dev=DEVICE_SHIFT, _free=FREE):
        ext((clock(), (device_id << _dev) | _free, mem_ptr, mem_size, 0, stream().ptr))

    return malloc_postprocess, free_postprocess


def _site_callbacks(ext, clock, stream, failed, sites):  # type: ignore[no-untyped-def]
    # The fast paths of SiteTable.site_of are inlined: the caller's frame is usually user code
    # already seen at this instruction (one frame fetch, one dict lookup), or one CuPy Python
    # function (cupy.empty, cupy.arange, ...) called from such a line (one more of each).
    getframe = sys._getframe
    by_offset = sites.by_offset
    internal = sites.internal
    site_of = sites.site_of

    def malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                           _site=SITE_SHIFT, _dev=DEVICE_SHIFT):
        f = getframe(1)
        c = id(f.f_code)
        s = by_offset.get((c, f.f_lasti))  # only frames outside skipped dirs are keys
        if s is None:
            b = f.f_back
            if b is None or not internal.get(c) or (s := by_offset.get((id(b.f_code), b.f_lasti))) is None:
                s = site_of(f)
        if mem_ptr:
            ext((clock(), ((s + 1) << _site) | (device_id << _dev), mem_ptr, size, mem_size, stream().ptr))
        elif size:
            failed(device_id, size, mem_size, s)

    return malloc_postprocess, _callbacks(ext, clock, stream, failed)[1]


def cupy_hook(cupy: Any, **kw: Any) -> TraceHook:
    """A TraceHook that is also a ``cupy.cuda.MemoryHook`` (so ``with hook:`` registers it)."""
    cls = type("TracekitMemoryHook", (TraceHook, cupy.cuda.MemoryHook), {"name": "tracekit"})
    hook: TraceHook = cls(**kw)
    return hook
