"""A replay started while its trace is still being read: the read and the kernel overlap.

``replay --sim`` reads the whole trace (Parquet, checks, the pairing of frees with mallocs) and
then replays it; on a 10M-event trace each takes about as long as the other. A policy that replays
in steps over ranges of events (``Stepped``: the free lists' ``HeapSteps``) can start on the events
the reader has copied while it reads the next ones. ``HeadStart`` takes each window of rows the
reader hands over (``tracekit.trace.columns.Window``); in threads of its own (the kernels let go
of the GIL) one pairs the window's frees with their mallocs in a small table of the live blocks,
the other replays the rows paired, up to the first row whose input only the whole trace can give:
an ``oom`` row (handled or fatal is known at the end), a malloc at a live address or a free of
none (the reader drops or flags those), a request of 2^62 bytes or more (clamped by ``prepare``),
an op or a column of a type the format does not have.

What it replayed counts only where the finished read agrees: ``finish(trace)`` compares, row by
row, the kinds, the requested sizes and the frees' mallocs it replayed with those of the trace as
read (``tracekit.sim.prepare``), then replays the rest of the trace from there with the trace's
own input; where anything differs (or the read dropped events) it answers None and the caller
replays the whole trace as before. Same input, same kernel: the same answer either way
(``tests/unit/test_head_start.py`` holds it on traces built to stop it at each of the causes).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

import numpy as np

from tracekit import interrupts
from tracekit.trace.columns import Window, window_op_codes
from tracekit.trace.schema import INT_COLUMNS

if TYPE_CHECKING:  # the kernels (numba) load in the head start's thread, during the read
    from tracekit.sim.base import PolicyRun, SimConfig
    from tracekit.trace.reader import Trace

__all__ = ["HeadStart", "Stepped", "Steps", "head_start"]

MIN_CORES = 4  # on fewer, the reader's own threads hold the cores: the overlap measured slower (2 cores:
# 3.7-3.9 s against 3.1-3.3 s for 10M events read, then replayed)
SWITCH = "TRACEKIT_HEAD_START"  # "0": off; "1": on whatever the cores and the size (benchmarks compare
# the two; the package's precompile step compiles the head start's kernels on a small trace)
MIN_EVENTS = 1 << 20  # below, the threads' start and checks are not worth it (a trace of 1M rows or
# fewer is read in one window: only the reader's checks after it overlap)


class Steps(Protocol):
    """One replay run a range of events at a time, in order (``FreeListModel.stepper``)."""

    def grow(self, max_live: int) -> None: ...

    def step(self, kind: np.ndarray, size: np.ndarray, mate: np.ndarray, rep: np.ndarray, holder: np.ndarray,
             lo: int, hi: int) -> bool: ...

    def finish(self) -> PolicyRun: ...

    @property
    def stopped(self) -> bool: ...


class Stepped(Protocol):
    """A policy that replays in steps (its ``stepper``), so a replay can start during the read."""

    def stepper(self, config: SimConfig, n: int, max_live: int) -> Steps: ...


@contextlib.contextmanager
def head_start(model: object, config: SimConfig) -> Iterator[HeadStart | None]:
    """A ``HeadStart`` for ``model`` (None where the policy does not replay in steps, or on fewer
    than ``MIN_CORES`` cores unless ``TRACEKIT_HEAD_START`` says otherwise); its threads are stopped
    and joined when the block ends, however it ends."""
    if not (wanted() and callable(getattr(model, "stepper", None))):
        yield None
        return
    forced = os.environ.get(SWITCH, "").strip() == "1"
    head = HeadStart(model, config, 0 if forced else MIN_EVENTS)  # type: ignore[arg-type]
    try:
        yield head
    finally:
        head.close()


def wanted() -> bool:
    """Whether a replay starts during the read here: on ``MIN_CORES`` cores or more this process
    may run on, unless ``TRACEKIT_HEAD_START`` says otherwise."""
    said = os.environ.get(SWITCH, "").strip()
    if said in ("0", "1"):
        return said == "1"
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this platform
        cores = os.cpu_count() or 1
    return cores >= MIN_CORES


_STEP = 1 << 20  # rows a kernel call replays: the stop flag is read between calls


class HeadStart:
    """Takes the reader's windows (``take``), pairs and replays them in threads of its own (see
    the module); ``finish`` answers once the read is done."""

    def __init__(self, model: Stepped, config: SimConfig, min_events: int = MIN_EVENTS) -> None:
        self.model, self.config, self.min_events = model, config, min_events
        self._windows: queue.SimpleQueue[Window | None] = queue.SimpleQueue()
        self._paired: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._abandon = False  # close() or an error: the threads stop at their next check
        self.n = 0
        self.done = 0  # rows replayed (all inputs agreed up to here, as far as the windows tell)
        self.steps: Steps | None = None
        self.error: BaseException | None = None
        # numba and the kernels loaded (from numba's cache) while the reader reads its first window:
        # a kernel's first call in a thread otherwise loads them then, holding the GIL (0.35 s of the
        # first step on the 16-core host, the pairing beside it waiting)
        threading.Thread(target=_load_kernels, args=(model, config), name="tracekit-head-load",
                         daemon=True).start()

    # -- the reader's side -------------------------------------------------------------------------

    def take(self, window: Window) -> None:
        """One window of rows read (in order); the first one starts the threads."""
        if not self._threads:
            if window.total < self.min_events:
                return
            self.n = window.total
            self.op = np.empty(self.n, np.int8)  # the windows' op codes, as they come
            self.kind = np.empty(self.n, np.int8)
            self.mate = np.empty(self.n, np.int64)
            self._threads = [threading.Thread(target=self._guarded, args=(run,), name=f"tracekit-head-{what}",
                                              daemon=True)
                             for what, run in (("pair", self._pair_windows), ("replay", self._replay_paired))]
            for t in self._threads:
                t.start()
        self._windows.put(window)

    def close(self) -> None:
        """Stop the threads (the replay at its next step) and wait for them."""
        self._abandon = True
        self._join()

    def _join(self, signals: bool = False) -> None:
        """Wait for the threads (``signals``: raising a signal held back meanwhile, as a replay does
        between its steps: ``interrupts.check``)."""
        if self._threads:
            self._windows.put(None)
            for t in self._threads:
                while t.is_alive():
                    t.join(0.05)
                    if signals:
                        interrupts.check()
            self._threads = []

    # -- the threads: one pairs each window's frees, one replays the rows paired -------------------

    def _guarded(self, run: Callable[[], None]) -> None:
        try:
            run()
        except BaseException as e:  # kept: finish() then replays as before
            self.error = e
            self._abandon = True

    def _pair_windows(self) -> None:
        """Pair each window's frees with their mallocs and hand the rows paired on, with the most
        requests live so far, up to the first row the head start cannot replay."""
        try:
            from tracekit.sim._head_kernel import pair
            from tracekit.trace.live_table import grow, new_table

            keys, tags, vals = new_table()
            state = np.zeros(3, np.int64)
            while (window := self._windows.get()) is not None:
                if self._abandon:
                    continue
                cols = _columns(window, self.op)
                if cols is None:
                    self._drain_windows()
                    continue
                addr, device, self.size = cols
                hi = window.at + window.rows
                stop, at = pair(self.op, addr, device, self.size, window.at, hi, self.kind, self.mate, keys,
                                tags, vals, state)
                while stop < 0 and at < hi:  # stopped for the table to grow
                    keys, tags, vals = grow(keys, tags, vals)
                    stop, at = pair(self.op, addr, device, self.size, at, hi, self.kind, self.mate, keys,
                                    tags, vals, state)
                self._paired.put((hi if stop < 0 else int(stop), int(state[1])))
                if stop >= 0:
                    self._drain_windows()
        finally:
            self._paired.put(None)  # the replay's thread ends with the pairing's, however it ends

    def _drain_windows(self) -> None:
        """No more rows to hand on: the windows still coming are only taken off the queue."""
        while self._windows.get() is not None:
            pass
        self._windows.put(None)  # seen again by the loop, which then ends

    def _replay_paired(self) -> None:
        """Replay the rows paired, a step at a time, while the reader and the pairing go on."""
        none = np.zeros(0, np.int64)
        while (paired := self._paired.get()) is not None:
            end, most = paired
            if self._abandon or (self.steps is not None and self.steps.stopped):
                continue
            if self.steps is None:
                self.steps = self.model.stepper(self.config, self.n, most)
            self.steps.grow(most)
            for a in range(self.done, end, _STEP):
                if self._abandon:
                    break
                stopped = self.steps.step(self.kind, self.size, self.mate, none, none, a, min(end, a + _STEP))
                self.done = min(end, a + _STEP)  # the rows the kernel may have read: finish() checks them
                if stopped:  # at its first failed request: finish() takes the run as it is
                    break

    # -- the answer ---------------------------------------------------------------------------------

    def finish(self, trace: Trace) -> PolicyRun | None:
        """The replay of ``trace`` (the rows replayed here, then the rest with the trace's own
        input), or None where the thread did not start or its rows do not agree with the trace."""
        from tracekit import progress
        from tracekit.sim._head_kernel import agrees
        from tracekit.sim.prepare import attempt_kinds, holders, prepare

        self._join(signals=True)
        steps = self.steps
        if steps is None or self.error is not None or len(trace.events) != self.n or self._abandon:
            return None
        inp = prepare(trace)
        kind = attempt_kinds(inp, self.config.stop_at_first_oom)
        p = self.done
        if not agrees(self.kind, self.size, self.mate, kind, inp.size, inp.mate, p):
            return None
        if not steps.stopped:
            holder = holders(inp)
            steps.grow(inp.max_live)
            for lo, hi in progress.chunks(len(inp)):  # the rows replayed already: reported at once
                if hi > p and steps.step(kind, inp.size, inp.mate, inp.replaced_by, holder, max(lo, p), hi):
                    break
        return steps.finish()


def _load_kernels(model: Stepped, config: SimConfig) -> None:
    """Call the pairing and the model's step on no rows, with the argument types of the real calls
    (so numba loads the same compiled versions)."""
    with contextlib.suppress(Exception):  # anything amiss shows again in the real calls
        from tracekit.sim._head_kernel import pair
        from tracekit.trace.live_table import grow, new_table

        none = np.zeros(0, np.int64)
        keys, tags, vals = grow(*new_table())
        pair(np.zeros(0, np.int8), np.zeros(0, np.uint64), np.zeros(0, np.int16), none.copy(), 0, 0,
             np.zeros(0, np.int8), none.copy(), keys, tags, vals, np.zeros(3, np.int64))
        model.stepper(config, 0, 0).step(np.zeros(0, np.int8), none.copy(), none.copy(), none, none, 0, 0)


def _columns(window: Window, op: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The whole-file addr, device and size arrays (size as int64), the window's op codes written
    into ``op``; None where a column is not of the format's type (the reader converts or refuses
    it). A null leaves a filler in its slot: in ``addr`` of an ``oom`` row (where the head start
    stops anyway), elsewhere it fails the read, so nothing replayed here is used."""
    ints = window.ints
    addr, device, size = ints.get("addr"), ints.get("device"), ints.get("size")
    if addr is None or device is None or size is None:  # a null in them (a filler here) fails the read
        return None
    if any(a.dtype != INT_COLUMNS[name] for name, a in (("addr", addr), ("device", device), ("size", size))):
        return None
    if not window_op_codes(window, op):
        return None
    return addr, device, size.view(np.int64)
