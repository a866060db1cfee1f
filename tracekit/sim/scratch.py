"""Work arrays lent to replays: per-event arrays a kernel needs only while it runs.

A pool kernel keeps two arrays of one entry per event: each row's status (int8: a free reads its
malloc's) and each malloc's block (int64). A replay returns the status only where its per-event
outputs are wanted (``SimConfig.per_event``); the blocks never. Advise's searches replay one trace
a few dozen times and read only the summaries, so a replay there takes both arrays from ``WORK``
and gives them back when it ends.

While a ``WORK.keeping()`` is open (advise's runner, for the life of its search), arrays given
back are kept and lent again to the next replay, so the search's replays take no fresh memory
after the first on each thread. Fresh memory was most of a search's system time: each first touch
of a page is a fault, and a process's faults wait on one another (about 39,000 pages a replay of
10M PyTorch events; 7.8 s of system time in one advise on the 2-core machine; docs/performance.md).
Outside one, an array given back is dropped at once. The replays of one search differ in length
(a counterfactual round inserts rows), so a kept array lends its first ``n`` entries to a borrower
of ``n`` or fewer, and an array given back replaces a shorter kept one: no more arrays of a type are
kept than were lent at once, and never more than ``MAX_KEPT``. Memory stays what the search would
have used anyway, and goes when it ends.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

MAX_KEPT = 64  # arrays kept per type at most, whatever the threads


class Lender:
    """Arrays of one dtype lent out and, while ``keeping``, kept for the next borrower."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = 0  # ``keeping`` blocks open (nested and threaded ones count each)
        self._kept: dict[np.dtype, list[np.ndarray]] = {}  # per type, shortest first

    @contextmanager
    def keeping(self) -> Iterator[None]:
        """Keep arrays given back inside this block for later borrowers; drop them all at its end."""
        with self._lock:
            self._open += 1
        try:
            yield
        finally:
            with self._lock:
                self._open -= 1
                if self._open == 0:
                    self._kept.clear()

    def take(self, n: int, dtype: type[np.generic], *, zeroed: bool) -> np.ndarray:
        """An array of ``n`` entries of ``dtype``: the first ``n`` of the shortest kept one that has
        as many, else a fresh one; all zero if ``zeroed`` (else whatever a former borrower left)."""
        out = None
        with self._lock:
            kept = self._kept.get(np.dtype(dtype), [])
            k = next((k for k, a in enumerate(kept) if len(a) >= n), None)
            if k is not None:
                whole = kept.pop(k)
                out = whole if len(whole) == n else whole[:n]
        if out is None:  # NumPy's own allocation: zeros come from the kernel, untouched until written
            return np.zeros(n, dtype) if zeroed else np.empty(n, dtype)
        if zeroed:
            out.fill(0)
        return out

    def give(self, *arrays: np.ndarray) -> None:
        """Hand ``arrays`` (as ``take`` gave them) back: the borrower holds no reference to them any
        more. Each replaces the shortest kept array of its type where that one is shorter."""
        with self._lock:
            if self._open == 0:
                return
            for a in arrays:
                whole = a.base if isinstance(a.base, np.ndarray) else a  # a view ``take`` made
                kept = self._kept.setdefault(whole.dtype, [])
                if kept and (len(kept[0]) < len(whole) or len(kept) >= MAX_KEPT):
                    if len(kept[0]) >= len(whole):
                        continue  # as long as every kept one, and MAX_KEPT of them: dropped
                    kept.pop(0)
                kept.append(whole)
                kept.sort(key=len)

    def kept_bytes(self) -> int:
        """Bytes held for later borrowers now (0 outside ``keeping``)."""
        with self._lock:
            return sum(a.nbytes for arrays in self._kept.values() for a in arrays)

    def kept_count(self) -> int:
        """Arrays held for later borrowers now."""
        with self._lock:
            return sum(len(arrays) for arrays in self._kept.values())


WORK = Lender()  # the process's one lender: every kernel's work arrays
