"""The allocation hook: CuPy's MemoryHook callbacks turned into raw integer rows.

Every event is one atomic append of eight int64 onto ``EventBuffer.rows`` (a
``fastpath.Rows``: C memory, no Python object per row, where the helper is compiled; a list of
ints where not): ``t``, ``code``, ``addr``, ``size``, ``rounded``,
``stream``, ``device_free``, ``stack``, where ``code = (site + 1) << 32 | (pool + 1) << 12
| device << 4 | op`` and ``device_free`` is ``cudaMemGetInfo``'s free bytes
measured right after a device-level event (-1 = not measured) and ``stack`` the
request's whole call stack (``tracekit.record.callstacks``; -1 = none). One C call
per event keeps the hook cheap and makes it safe from any thread (a row is
never torn), and the writer turns the list into NumPy columns once per batch,
so no Python object outlives a batch. CuPy calls six callbacks per
malloc/free pair with keyword arguments; the four the recorder does not need
are bound to ``dict`` (a C call, cheaper than a no-op Python method) and the
two it needs are closures whose parameters are named, so CPython binds the
keywords without building a dict. Call-sites and stacks are captured for
malloc and oom rows only: a free belongs to the block its malloc made (readers
pair them), and a frame lookup at every free would double the cost (a free's
stack slot is -1). ``op`` 15 marks a note row: ``addr`` is the
index of a JSON-able dict in ``EventBuffer.notes`` describing the event
written just before it (the device and the pool at an out-of-memory error).

Devices: CuPy 14 builds the per-device pools of a ``MemoryPool`` all at once
while one device is current, so every one of them reports that device's id
to ``malloc_postprocess`` (cupy/cuda/memory.pyx,
``_ensure_pools_and_return_device_pool``). The pool a malloc uses is chosen by
the current device, so on a machine with several devices the hook writes the
current device and counts the rows where CuPy said otherwise
(``mismatches``); frees carry the block's own device, which is right. A
malloc's pool is not known to the hook: it is the pool whose segment holds the
pointer, resolved when the trace is written (``pool`` field 0 = resolve).
"""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
import time
from collections.abc import Callable
from itertools import accumulate, takewhile
from typing import Any

import numpy as np

from tracekit.record.callstacks import LiveStacks, frame_code, frame_lasti
from tracekit.record.fastpath import NATIVE_CLOCK, Hook, RingWriter, Rows, window_frames
from tracekit.record.sites import SiteTable
from tracekit.trace.schema import Op

ROW = 8  # ints per event
NOTE = 15  # op code of a note row
DEVICE_SHIFT = 4
POOL_SHIFT = 12
SITE_SHIFT = 32
DEVICE_MASK = 0xFF
POOL_MASK = 0xFFFFF
UNMEASURED = -1  # device_free slot of a row where nothing was measured

MALLOC, FREE, SEGMENT_ALLOC, SEGMENT_FREE, OOM = (int(op) for op in Op)


def code_of(op: int, device: int, pool: int | None = None, site: int = -1) -> int:
    """The packed ``code`` int of a row (``pool`` None = resolve from segments later)."""
    p = 0 if pool is None else pool + 1
    return ((site + 1) << SITE_SHIFT) | (p << POOL_SHIFT) | (device << DEVICE_SHIFT) | op


class EventBuffer:
    """The flat list all threads append rows to, and the notes rows point at.

    The rows are written in the program's own threads: after each row the hook calls ``trim``
    once the clock passes ``due`` (``interval_ns`` after the last write) or ``cap`` ints are held;
    it writes what waits (``drain``) and deletes the rows written (``record.spool`` says why no
    other thread does). ``written`` counts the ints of ``rows`` already written by the spool's own
    thread (after a silence), deleted at the next trim; ``lock`` orders the writer and ``trim``.
    """

    def __init__(self) -> None:
        self.rows = Rows(ROW)  # int64 in C memory where compiled (fastpath.Rows), else a list of ints
        self.extend = self.rows.extend
        self.notes: dict[int, dict[str, Any]] = {}  # note index -> note (indices from any thread)
        self._next_note = itertools.count().__next__  # atomic under the GIL
        self.taken = 0  # rows handed to the writer so far
        self.written = 0  # ints of ``rows`` written to the spool, deleted at the next trim
        self.interval_ns = 0
        self.lock = threading.RLock()
        self.busy = False  # the writer is writing (set under ``lock``): trim waits or, in its thread, skips
        self._drain: Callable[[], None] | None = None
        self.before_write: Callable[[], None] | None = None  # rows to add first (the segments' ends)

    @property
    def cap(self) -> int:
        """Ints held at which the hook trims (``attach``); kept in ``rows``, where C reads it."""
        return self.rows.cap

    @cap.setter
    def cap(self, value: int) -> None:
        self.rows.cap = value

    @property
    def due(self) -> int:
        """``perf_counter_ns`` at which the hook trims (``attach``); kept in ``rows``."""
        return self.rows.due

    @due.setter
    def due(self, value: int) -> None:
        self.rows.due = value

    def mirror(self, ring: RingWriter) -> None:
        """Every row also into the shared ``ring`` (``tracekit.record.tail``), in the call that
        appends it (``Rows.mirror``; compiled helper only)."""
        self.rows.mirror(ring)

    def attach(self, cap: int, interval_ns: int, drain: Callable[[], None]) -> None:
        """Trim at ``cap`` ints held or ``interval_ns`` after the last trim; ``drain()`` (called
        under ``lock``) writes what waits."""
        self.cap, self.interval_ns, self._drain = cap, interval_ns, drain
        self.due = time.perf_counter_ns() + interval_ns

    def waiting(self) -> int:
        """Ints appended and not yet written."""
        return len(self.rows) - self.written

    def check(self) -> None:
        """``trim`` if it is due (for the rows appended outside the hook)."""
        if len(self.rows) >= self.cap or time.perf_counter_ns() >= self.due:
            self.trim()

    def trim(self) -> None:
        """In a program's thread: write what waits, then delete every row written.

        Skipped where the writer itself is running in this thread (a garbage collection during a
        flush ran a finalizer that freed a block): the next row trims."""
        with self.lock:
            if self.busy:
                return
            if self._drain is None:  # no writer (a forked child): nothing is kept
                del self.rows[:]
                self.written = 0
            else:
                if self.before_write is not None:
                    with contextlib.suppress(Exception):  # never let recording break the program
                        self.before_write()
                self._drain()
                self.taken += self.written // ROW
                # The two next statements as close together as they can be: an exception raised
                # between them (the stop signal's) would lose the rows written since.
                del self.rows[:self.written]
                self.written = 0
                self.due = time.perf_counter_ns() + self.interval_ns

    def detach(self) -> None:
        """In a forked child: no writer, no rows, a fresh lock (another thread may have held it)."""
        self.lock = threading.RLock()
        self.busy = False
        self._drain = None
        self.due = self.cap = sys.maxsize
        del self.rows[:]
        self.written = 0

    def take(self) -> np.ndarray:
        """Remove and return the rows so far as an (n, ROW) int64 array (safe against appenders)."""
        rows = self.rows
        n = len(rows)  # always a multiple of ROW: each extend is one atomic call
        chunk = _as_rows(rows.to_bytes(0, n))
        del rows[:n]  # appends land past n, so this removes exactly the rows taken
        self.taken += n // ROW
        self.written = 0
        return chunk

    def peek(self) -> np.ndarray:
        """The rows held now as an (n, ROW) int64 array, left in place (a copy)."""
        return _as_rows(self.rows.to_bytes(0, len(self.rows)))

    def note(self, row: tuple[int, ...], note: dict[str, Any], clock: Callable[[], int]) -> int:
        """Append an event row and, in the same atomic extend, the note row describing it.

        Returns the note's index, which the note also holds as ``note``.
        """
        index = self._next_note()
        self.notes[index] = {**note, "note": index}
        self.extend((*row, clock(), NOTE, index, 0, 0, 0, UNMEASURED, -1))
        return index

    def annotate(self, note: dict[str, Any], clock: Callable[[], int]) -> None:
        """A note row about the recording itself (a new pool), not about one event."""
        index = self._next_note()
        self.notes[index] = {**note, "note": index}
        self.extend((clock(), NOTE, index, 0, 0, 0, UNMEASURED, -1))


def _as_rows(data: bytes) -> np.ndarray:
    """Little-endian int64 bytes (``Rows.to_bytes``) as a writable (n, ROW) int64 array."""
    return np.frombuffer(data, dtype="<i8").astype(np.int64).reshape(-1, ROW)


def unpack(raw: np.ndarray) -> dict[str, np.ndarray]:
    """Split an (n, ROW) raw row array into named columns (op, device, pool and site from ``code``)."""
    code = raw[:, 1]
    return {
        "t": raw[:, 0],
        "op": (code & 15).astype(np.int8),
        "device": ((code >> DEVICE_SHIFT) & DEVICE_MASK).astype(np.int16),
        "pool": (((code >> POOL_SHIFT) & POOL_MASK) - 1).astype(np.int32),  # -1 = resolve later
        "site": ((code >> SITE_SHIFT) - 1).astype(np.int32),
        "addr": raw[:, 2],
        "size": raw[:, 3],
        "rounded": raw[:, 4],
        "stream": raw[:, 5],
        "device_free": raw[:, 6],
        "stack": raw[:, 7].astype(np.int32),
    }


class TraceHook:
    """CuPy memory-hook callbacks that log malloc, free and failed (out-of-memory) requests.

    ``current_stream`` is ``cupy.cuda.get_current_stream`` (anything returning an
    object with ``.ptr``); ``oom_state(device_id)`` returns ``(pool id, state)``:
    the pool that raised and the measured device (an ``oom_states`` entry
    without seq and time). ``current_device`` (``cupy.cuda.runtime.getDevice``)
    is given only where the machine has several devices. ``sites=None``
    records no call-sites; ``stacks`` (with ``sites``) records whole stacks
    too. Use ``cupy_hook`` to get the registrable subclass.
    """

    name = "tracekit"

    def __init__(
        self,
        buffer: EventBuffer,
        *,
        sites: SiteTable | None,
        stacks: LiveStacks | None = None,
        current_stream: Callable[[], Any],
        oom_state: Callable[[int], tuple[int | None, dict[str, Any]]] = lambda device_id: (None, {}),
        current_device: Callable[[], int] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
        segments: Any = None,
        sweep: Callable[[], None] | None = None,
        stream_ptr: object = None,
    ) -> None:
        self.buffer = buffer
        self.segments = segments  # tracekit.record.device_alloc.HookedSegments: the pools' device rows
        self._sweep = sweep  # ends the segments CuPy freed (HookedSegments.sweep over the pools)
        self.sites = sites
        self._oom_state = oom_state
        self._clock = clock
        self._stream = current_stream
        self.mismatches: list[int] = []  # one entry per row whose reported device was wrong
        self.alloc_preprocess: Callable[..., Any] = dict
        self.alloc_postprocess: Callable[..., Any] = dict
        if segments is not None:
            self.alloc_preprocess, self.alloc_postprocess = _alloc_callbacks(segments, current_device)
        self.malloc_preprocess: Callable[..., Any] = dict
        self.free_preprocess: Callable[..., Any] = dict
        device = _device_check(current_device, self.mismatches.append)
        if Hook is not None:  # the compiled callbacks: no Python frame per event (fastpath.Hook)
            compiled = _compiled_callbacks(buffer, clock, current_stream, self._failed, device, sites, stacks,
                                           stream_ptr)
            self.malloc_postprocess, self.free_postprocess, ignore = compiled
            self.malloc_preprocess = self.free_preprocess = ignore
            if segments is None:
                self.alloc_preprocess = self.alloc_postprocess = ignore
            return
        if sites is None:
            callbacks = _callbacks(buffer, clock, current_stream, self._failed, device)
        elif stacks is None:
            callbacks = _site_callbacks(buffer, clock, current_stream, self._failed, sites, device)
        else:
            callbacks = _stack_callbacks(buffer, clock, current_stream, self._failed, stacks, device)
        self.malloc_postprocess, self.free_postprocess = callbacks

    def _failed(self, device_id: int, size: int, mem_size: int, site: int, stack: int = -1) -> None:
        """A malloc returned no memory: log an ``oom`` row if the pending exception is a MemoryError."""
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, MemoryError):
            return  # another error (a CUDA fault, an interrupt): not an out-of-memory request
        if self._sweep is not None:  # the segments CuPy freed while retrying come first
            with contextlib.suppress(Exception):
                self._sweep()
        try:
            pool, state = self._oom_state(device_id)
        except Exception as e:  # the device could not answer; keep the row anyway
            pool, state = None, {"error": f"{type(e).__name__}: {e}"}
        counters = state.get("pool") or {}
        note = {
            "kind": "oom", "device": device_id, "size": size, "rounded": mem_size,
            "exception": None if exc is None else type(exc).__name__,
            "message": None if exc is None else str(exc), "pool_id": pool,
            "used_bytes": counters.get("used_bytes"), "total_bytes": counters.get("total_bytes"),
            "free_bytes": counters.get("free_bytes"), "n_free_blocks": counters.get("n_free_blocks"),
            "limit": counters.get("limit_bytes"), "state": state,
        }
        free = state.get("mem_free")
        row = (self._clock(), code_of(OOM, device_id, pool, site), 0, size, mem_size, self._stream().ptr,
               UNMEASURED if free is None else int(free), stack)
        index = self.buffer.note(row, note, self._clock)
        if exc is not None:  # lets the recording tell which OOM ended the program
            with contextlib.suppress(AttributeError):  # an exception type without a __dict__
                exc._tracekit_oom_note = index  # type: ignore[attr-defined]


def _alloc_callbacks(segments: Any, current: Callable[[], int] | None) -> tuple[Callable[..., None],
                                                                               Callable[..., None]]:
    """``alloc_preprocess``/``alloc_postprocess``: a pool's device allocation (rare: no fast path).
    On several devices the device is the current one (CuPy may report the pool's first)."""

    def alloc_preprocess(device_id: int, mem_size: int) -> None:
        with contextlib.suppress(Exception):  # never let recording break the program's allocation
            segments.before_alloc(current() if current is not None else device_id, mem_size)

    def alloc_postprocess(device_id: int, mem_size: int, mem_ptr: int) -> None:
        with contextlib.suppress(Exception):
            segments.after_alloc(current() if current is not None else device_id, mem_size, mem_ptr)

    return alloc_preprocess, alloc_postprocess


def _device_check(current: Callable[[], int] | None,
                  mismatch: Callable[[int], None]) -> Callable[[int], int] | None:
    """None on a one-device machine (CuPy's id is right); else a function giving the true device."""
    if current is None:
        return None

    def device(reported: int) -> int:
        d = current()
        if d != reported:
            mismatch(reported)
        return d

    return device


# The row-code constants are bound as parameter defaults: locals cost no global lookup per event.
# After each row the hook trims the buffer when it is due (EventBuffer.trim): two attribute reads
# of the rows' limits, one length and two comparisons per event.
def _callbacks(buf, clock, stream, failed, device):  # type: ignore[no-untyped-def]
    ext, rows = buf.extend, buf.rows

    def malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                           _dev=DEVICE_SHIFT, _na=UNMEASURED, _len=len):
        if device is not None:
            device_id = device(device_id)
        if mem_ptr:
            t = clock()
            ext((t, device_id << _dev, mem_ptr, size, mem_size, stream().ptr, _na, -1))
            if t >= rows.due or _len(rows) >= rows.cap:
                buf.trim()
        elif size:
            failed(device_id, size, mem_size, -1)

    def free_postprocess(device_id, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                         _dev=DEVICE_SHIFT, _free=FREE, _na=UNMEASURED, _len=len):
        t = clock()
        ext((t, (device_id << _dev) | _free, mem_ptr, mem_size, 0, stream().ptr, _na, -1))
        if t >= rows.due or _len(rows) >= rows.cap:
            buf.trim()

    return malloc_postprocess, free_postprocess


def _site_callbacks(buf, clock, stream, failed, sites, device):  # type: ignore[no-untyped-def]
    # The fast paths of SiteTable.site_of are inlined: the caller's frame is usually user code
    # already seen at this instruction (one frame fetch, one dict lookup), or one CuPy Python
    # function (cupy.empty, cupy.arange, ...) called from such a line (one more of each).
    getframe = sys._getframe
    by_offset = sites.by_offset
    internal = sites.internal
    site_of = sites.site_of
    ext, rows = buf.extend, buf.rows

    def malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                           _site=SITE_SHIFT, _dev=DEVICE_SHIFT, _na=UNMEASURED, _len=len):
        f = getframe(1)
        c = id(f.f_code)
        s = by_offset.get((c, f.f_lasti))  # only frames outside skipped dirs are keys
        if s is None:
            b = f.f_back
            if b is None or not internal.get(c) or (s := by_offset.get((id(b.f_code), b.f_lasti))) is None:
                s = site_of(f)
        if device is not None:
            device_id = device(device_id)
        if mem_ptr:
            t = clock()
            ext((t, ((s + 1) << _site) | (device_id << _dev), mem_ptr, size, mem_size, stream().ptr, _na, -1))
            if t >= rows.due or _len(rows) >= rows.cap:
                buf.trim()
        elif size:
            failed(device_id, size, mem_size, s)

    return malloc_postprocess, _callbacks(buf, clock, stream, failed, device)[1]


def _compiled_callbacks(buf: EventBuffer, clock: Callable[[], int], stream: Callable[[], Any],
                        failed: Callable[..., None], device: Callable[[int], int] | None,
                        sites: SiteTable | None, stacks: LiveStacks | None,
                        stream_ptr: object = None) -> tuple[Callable[..., None], ...]:
    """(malloc_postprocess, free_postprocess, a no-op) of a C ``fastpath.Hook``: the rows the Python
    callbacks below write, without a Python frame per event. Whole stacks: the hook hashes the
    stack's window and looks it up in ``stacks.hot`` itself; the one-frame site: a window of
    ``SITE_WINDOW`` frames, which answers for a site found in it; neither: no window.
    A window the hot table cannot answer goes to a Python ``resolve`` (a miss, LONGER, no site).
    ``stream_ptr``: CuPy's C function for the current stream (``stream_capsule``), or None.
    The hot table only gains keys, each set once (``LiveStacks.miss``, ``_site_resolver``): the
    compiled hook keeps the final answers it has read in a table of its own."""
    assert Hook is not None
    kw: dict[str, Any] = {"clock": None if clock is time.perf_counter_ns and NATIVE_CLOCK else clock,
                          "device": device, "stream_ptr": stream_ptr}
    if stacks is not None:
        kw.update(hot=stacks.hot, resolve=_stack_resolver(stacks), depth=stacks.depth,
                  launcher=stacks.launcher)
    elif sites is not None:
        hot: dict[int, tuple[int, int]] = {}
        kw.update(hot=hot, resolve=_site_resolver(sites, hot), depth=SITE_WINDOW)
    hook = Hook(buf, stream, failed, **kw)
    return hook.malloc_postprocess, hook.free_postprocess, hook.ignore


SITE_WINDOW = 8  # frames the compiled one-frame site hashes: enough to reach past CuPy's own Python
# frames (cupy.random's are three or four deep) to the caller's, so the site is cached under the
# window; a window of CuPy's frames alone cannot answer for a site beyond it (Python each time)


def _stack_resolver(stacks: LiveStacks) -> Callable[[int, tuple[int | None, int] | None], tuple[int, int]]:
    """The compiled hook's slow path for whole stacks: the window's frames (``window_frames(1, ...)``
    from here reads the window the hook hashed: the hook has no frame of its own), named and interned
    where new (``miss``), read further where the depth was cut inside CuPy's (``longer``), the site
    looked up beyond the window where none is in it."""
    depth, launcher = stacks.depth, stacks.launcher
    miss, longer, site_of = stacks.miss, stacks.longer, stacks.sites.site_of

    def resolve(key: int, answer: tuple[int | None, int] | None) -> tuple[int, int]:
        frames = window_frames(1, depth, launcher)
        bits, st = miss(frames, key) if answer is None else answer
        # LONGER: the depth was cut short inside CuPy's frames (bits: their count); it counts from the site
        if st < -1 and bits is not None:
            bits, st = longer(frames, bits)
        if bits is None:  # no frame outside CuPy and tracekit in the window: the site lies beyond it
            bits = (site_of(frames[0] if frames else None) + 1) << SITE_SHIFT
        return bits, st

    return resolve


def _site_resolver(sites: SiteTable, hot: dict[int, tuple[int, int]]
                   ) -> Callable[[int, tuple[int, int] | None], tuple[int, int]]:
    """The compiled hook's slow path for the one-frame site: the site of the caller's frame (CuPy's
    frames skipped), remembered under the two-frame window's hash where the site is one of them."""
    site_of, internal = sites.site_of, sites.is_internal

    def resolve(key: int, answer: tuple[int, int] | None) -> tuple[int, int]:
        frames = window_frames(1, SITE_WINDOW, None)
        bits = (site_of(frames[0] if frames else None) + 1) << SITE_SHIFT
        if any(not internal(f.f_code) for f in frames):  # the window holds the site: it answers for it
            hot[key] = (bits, -1)
        return bits, -1

    return resolve


def _stack_callbacks(buf, clock, stream, failed, stacks, device):  # type: ignore[no-untyped-def]
    # The window read and its key (tracekit.record.callstacks.window, window_key) are inlined: C-level
    # iteration, one key, one dict lookup whose answer holds the site's row bits and the stack id,
    # so a window seen before runs no Python loop.
    getframe = sys._getframe
    hot = stacks.hot
    miss = stacks.miss
    longer = stacks.longer
    site_of = stacks.sites.site_of
    steps = stacks.steps
    stop = stacks.stop if stacks.stop is not None else bool  # bool: the stack's end alone
    ext, rows = buf.extend, buf.rows

    def malloc_postprocess(device_id, size, mem_size, mem_ptr, pmem_id,  # type: ignore[no-untyped-def]
                           _site=SITE_SHIFT, _dev=DEVICE_SHIFT, _na=UNMEASURED, _list=list,
                           _tw=takewhile, _acc=accumulate, _get=getattr, _map=map, _id=id,
                           _code=frame_code, _lasti=frame_lasti, _len=len):
        frames = _list(_tw(bool, _tw(stop, _acc(steps, _get, initial=getframe(1)))))
        v = hot.get((*_map(_id, _map(_code, frames)), *_map(_lasti, frames)))
        if v is None:
            v = miss(frames)
        bits, st = v
        if st < -1:  # LONGER: the depth was cut short inside CuPy's frames; it counts from the site
            bits, st = longer(frames, bits)
        if bits is None:  # no frame outside CuPy and tracekit in the stack: the site lies beyond it
            bits = (site_of(frames[0]) + 1) << _site
        if device is not None:
            device_id = device(device_id)
        if mem_ptr:
            t = clock()
            ext((t, bits | (device_id << _dev), mem_ptr, size, mem_size, stream().ptr, _na, st))
            if t >= rows.due or _len(rows) >= rows.cap:
                buf.trim()
        elif size:
            failed(device_id, size, mem_size, (bits >> _site) - 1, st)

    return malloc_postprocess, _callbacks(buf, clock, stream, failed, device)[1]


def stream_capsule(cupy: Any) -> object:
    """CuPy's C function for the current stream's handle, as a capsule the compiled hook calls
    directly: 0.08 µs a row less than ``get_current_stream().ptr``. The one of
    ``cupy_backends.cuda.stream`` where CuPy has loaded it (it always has: ``cupy.cuda.stream``
    is built on it), whose answer ``cupy.cuda.stream.get_current_stream_ptr`` (the function CuPy's
    pool keys its free lists by) only passes on, one thread-local lookup later; else that one
    (``__pyx_capi__``); None where this CuPy has neither (the hook then calls ``current_stream``).
    Nothing is imported here."""
    backends = sys.modules.get("cupy_backends.cuda.stream")
    for module in (backends, getattr(getattr(cupy, "cuda", None), "stream", None)):
        capi = getattr(module, "__pyx_capi__", None)
        if isinstance(capi, dict) and capi.get("get_current_stream_ptr") is not None:
            return capi["get_current_stream_ptr"]
    return None


def cupy_hook(cupy: Any, **kw: Any) -> TraceHook:
    """A TraceHook that is also a ``cupy.cuda.MemoryHook`` (so ``with hook:`` registers it); the
    current stream read through CuPy's C function where ``current_stream`` is CuPy's own."""
    if kw.get("current_stream") is getattr(cupy.cuda, "get_current_stream", None):
        kw.setdefault("stream_ptr", stream_capsule(cupy))
    cls = type("TracekitMemoryHook", (TraceHook, cupy.cuda.MemoryHook), {"name": "tracekit"})
    hook: TraceHook = cls(**kw)
    return hook
