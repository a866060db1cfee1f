"""The reader's pairing pass begun during the read: each window of rows paired as soon as it is in.

``read_trace`` reads a file a window of row groups at a time (``tracekit.trace.columns``) and then
runs its one compiled pass (``tracekit.trace._kernels.read_pass``: the malloc/free pairing and every
per-event check) over the whole file. The pass goes in event order and needs nothing from a later
row, so it can run on the rows already read while Arrow reads the next window: ``PairingAhead``
takes each window as ``Columns`` hands it over (its integer columns already in their whole-file
arrays), makes the window's ``op`` codes, and has a thread pass those rows; Arrow's reads and the
copies let go of the GIL, and so does the pass. On a 10M-event trace the pass is 0.15 s of a 0.8 s
read on the 2-core machine, more on the 16-core host.

Nothing changes in what the read answers: the pairing made ahead is taken only where the reader's
own arrays, once every check before the pass has passed, are the very arrays it paired (the file's
integer types are the format's, so no conversion made new ones) and the ``op`` codes it made are
the reader's; else (a window it could not code, the column-at-a-time fallback of a damaged file, an
error in the thread) the reader runs the pass itself, as before. The one thing the pass writes into
the columns, an unknown ``rounded`` (0) of a request set to its ``size``, is the same whichever runs
it, and running it twice writes nothing new.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from tracekit.trace.columns import Window, window_op_codes
from tracekit.trace.issues import Found
from tracekit.trace.schema import INT_COLUMNS
from tracekit.trace.validate import Pairing, checked_pairing, pass_tables, read_only

if TYPE_CHECKING:
    from tracekit.trace.readpass import PassLike

__all__ = ["PASSED", "PairingAhead"]

# The columns the pass reads, in the format's types: a file of other integer types is converted by
# the reader after the read (new arrays), so nothing is begun for it.
PASSED = {name: INT_COLUMNS[name] for name in ("seq", "t_ns", "addr", "size", "rounded", "device")}


class PairingAhead:
    """The pass over ``n`` events begun during the read (see the module): ``on_window`` for each
    window in order, then ``result``."""

    def __init__(self, n: int, max_request: int, limit: int) -> None:
        self._n = n
        self._max_request, self._limit = np.uint64(max_request), np.int64(limit)
        self._op = np.empty(0, np.int8)  # made at the first window, with the tables (``_begin``)
        self._cols: dict[str, np.ndarray] = {}
        self._views: tuple[np.ndarray, ...] = ()
        self._tables: tuple[np.ndarray, ...] = ()
        self._found = np.full(len(Found), -1, np.int64)
        self._pass: PassLike | None = None
        self._work: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failed = False
        self._coded = 0  # rows whose op codes are made

    def on_window(self, w: Window) -> None:
        """Code the window's ``op`` and hand its rows to the thread (nothing more once one failed)."""
        if self._failed:
            return
        if self._thread is None and not self._begin(w.ints):
            return
        # The window's op codes (-1 for a name the format does not have: the reader says which)
        try:
            ok = w.at == self._coded and window_op_codes(w, self._op)
            ok = ok and not (w.rows and int(self._op[w.at:w.at + w.rows].min()) < 0)
        except Exception:  # anything amiss in the column: the reader reads it its own way, and says
            ok = False
        if not ok:
            self.stop()
            return
        self._coded = w.at + w.rows
        self._work.put(self._coded)

    def result(self, op: np.ndarray, cols: Mapping[str, np.ndarray], addr: np.ndarray,
               size: np.ndarray) -> tuple[Pairing, np.ndarray] | None:
        """The pairing and ``Found`` faults (``validate.pair_and_check``'s answer), where the pass
        made ahead saw every event, and ``op`` and ``cols`` are what it paired; else None."""
        self.stop()
        ok = (not self._failed and self._pass is not None and self._coded == self._n
              and self._pass.at == self._n
              and all(cols.get(name) is arr for name, arr in self._cols.items())
              and np.array_equal(op, self._op))
        if not ok:
            return None
        assert self._pass is not None
        self._pass.finish(*read_only(op, addr, self._cols["device"]))
        keep, mate, counts, first = self._tables
        return checked_pairing(op, addr, self._cols["device"], self._cols["seq"], size, keep, mate, counts,
                               first, self._found)

    def _begin(self, ints: Mapping[str, np.ndarray]) -> bool:
        if any(name not in ints or ints[name].dtype != np.dtype(t) for name, t in PASSED.items()):
            self._failed = True
            return False
        try:  # 10 bytes a row: short of them, the reader's own pass says so, as before
            self._op = np.empty(self._n, np.int8)
            self._tables = pass_tables(self._n)
        except MemoryError:
            self._failed = True
            return False
        self._cols = {name: ints[name] for name in PASSED}
        c = self._cols
        # Read-only views but ``rounded`` (the pass fills unknown roundings): the reader's own call has
        # these types, so both reach the one compiled signature.
        self._views = (*read_only(self._op, c["seq"], c["t_ns"], c["addr"], c["size"]), c["rounded"],
                       *read_only(c["device"]))
        self._thread = threading.Thread(target=self._loop, name="tracekit-pairing-ahead", daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        from tracekit.trace.readpass import new_read_pass  # C, else numba (loaded by the reader's thread)

        keep, mate, counts, first = self._tables
        try:
            run = new_read_pass(keep, mate, counts, first, self._found, self._max_request, self._limit, True)
            self._pass = run
            op, seq, t_ns, addr, size, rounded, device = self._views
            while (end := self._work.get()) is not None:
                run.run(op, seq, t_ns, addr, size, rounded, device, end)
        except Exception:  # the reader runs the pass itself
            self._failed = True

    def stop(self) -> None:
        """Wait for the rows handed over so far to be passed; the thread then ends."""
        self._work.put(None)  # first: an interrupt after it still leaves the thread its way out
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join()
            self._thread = None
        self._failed = self._failed or self._coded != self._n
