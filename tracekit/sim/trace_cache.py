"""Values made once per trace object and kept while it lives: the one cache of what replays share.

``TraceCache.get(trace, make)`` returns ``make(trace)``, made once for that trace object (traces
are compared by identity) and held weakly: it goes with the trace. Several threads asking for the
same trace at once (advise's and whatif's, ``tracekit.workers.Pool.map``) wait for the
one that makes it; threads asking for different traces do not wait for each other. With ``keep``,
at most that many values are held, the least recently used dropped first: a value of a trace that
is asked for again and again (the prepared input every setting replays) stays while the traces
each replay makes for itself come and go.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

from tracekit.trace.reader import Trace

V = TypeVar("V")


class TraceCache(Generic[V]):
    """``make(trace)`` per trace object, made once, kept while the trace lives (see the module)."""

    def __init__(self, keep: int | None = None) -> None:
        self.keep = keep
        self._values: weakref.WeakKeyDictionary[Trace, V] = weakref.WeakKeyDictionary()
        self._making: weakref.WeakKeyDictionary[Trace, threading.Lock] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # held for dictionary updates only, never while a value is made

    def get(self, trace: Trace, make: Callable[[Trace], V]) -> V:
        """The value for ``trace``: held, else ``make(trace)``, made here or by the thread already
        making it (this one then waits for it)."""
        with self._lock:
            hit = self._used(trace)
            if hit is not None:
                return hit
            lock = self._making.setdefault(trace, threading.Lock())
        with lock:  # one thread makes it; the others wait here, then find it
            with self._lock:
                hit = self._used(trace)
            if hit is not None:
                return hit
            value = make(trace)
            with self._lock:
                if self.keep is not None:
                    while len(self._values) >= self.keep:  # least recently used first (insertion order)
                        del self._values[next(iter(self._values.keys()))]
                self._values[trace] = value
                self._making.pop(trace, None)
            return value

    def _used(self, trace: Trace) -> V | None:
        """The value held for ``trace``, moved to the most recently used end; None if none."""
        hit = self._values.get(trace)
        if hit is not None and self.keep is not None:
            del self._values[trace]
            self._values[trace] = hit
        return hit

    def __len__(self) -> int:
        return len(self._values)
