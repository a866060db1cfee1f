"""The reader's one pass (the malloc/free pairing and every per-event check), from whichever build has it.

``_kernels.read_pass`` is the pass in numba. Loading numba and that kernel from its cache takes a
fresh process 0.2 s on the 2-core machine and 0.77 s on the 16-core device host (docs/performance.md,
"What a process's first read waits for"), longer than the read of a 10M-event trace there (0.47 s).
So where the package was built with a C compiler, the pass is ``_readpass`` (the same pass in C,
statement for statement, built by ``setup.py`` beside the recorder's fast path) and a process's
first read waits for nothing but the file; numba loads beside it for the verbs' own kernels.
Without the C build the numba pass runs, as before; ``TRACEKIT_READ_PASS=numba`` asks for it.
``tests/unit/test_readpass_c.py`` holds the two equal, event sequences with every fault included.

The rare second step, counting the frees of no live allocation by kind (``_kernels.
classify_unpaired``), stays in numba: a trace that has such frees loads it then.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tracekit.trace.issues import Found, IssueKind, PassState
from tracekit.trace.schema import Op

if TYPE_CHECKING:
    from tracekit.trace._kernels import ReadPass

__all__ = ["COMPILED", "CReadPass", "PassLike", "new_read_pass", "read_pass"]


def _compiled() -> Any:
    """The C pass, configured with this module's codes; None where it was not built (or not asked for)."""
    if os.environ.get("TRACEKIT_READ_PASS", "") == "numba":
        return None
    try:
        import tracekit.trace._readpass as _readpass  # type: ignore[import-not-found]
    except ImportError:
        return None
    _readpass.configure(
        (Op.MALLOC, Op.FREE, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.OOM),
        (IssueKind.MALLOC_LIVE, IssueKind.SEGMENT_ALLOC_LIVE),
        (Found.SEQ_BACK, Found.T_BACK, Found.BIG_REQUEST, Found.OVER_LIVE, Found.OVER_RESERVED,
         Found.PAST_END),
        (PassState.AT, PassState.USED, PassState.UNPAIRED, PassState.LIVE_BYTES, PassState.RESERVED,
         PassState.COUNTING))
    return _readpass


_C = _compiled()
COMPILED = _C is not None  # the pass is the C one


class PassLike(Protocol):
    """What the reader needs of a pass (``_kernels.ReadPass``, ``CReadPass``)."""

    @property
    def at(self) -> int: ...

    def run(self, op: np.ndarray, seq: np.ndarray, t_ns: np.ndarray, addr: np.ndarray, size: np.ndarray,
            rounded: np.ndarray, device: np.ndarray, end: int) -> None: ...

    def finish(self, op: np.ndarray, addr: np.ndarray, device: np.ndarray) -> None: ...


class CReadPass:
    """``_kernels.ReadPass`` on the C pass: ``run`` up to an event (the rows read so far), then, once
    every event is in, ``finish``; the arguments are ``_kernels.read_pass``'s."""

    def __init__(self, keep: np.ndarray, mate: np.ndarray, counts: np.ndarray, first: np.ndarray,
                 found: np.ndarray, max_request: int | np.integer, limit: int | np.integer, checks: bool,
                 c: Any = None) -> None:
        self._table = (c or _C).Table()
        self.state = np.zeros(len(PassState), np.int64)
        self.state[PassState.COUNTING] = 1 if checks else 0
        self.keep, self.mate, self.counts, self.first, self.found = keep, mate, counts, first, found
        self.max_request, self.limit, self.checks = int(max_request), int(limit), bool(checks)

    @property
    def at(self) -> int:
        """The events passed so far."""
        return int(self.state[PassState.AT])

    def run(self, op: np.ndarray, seq: np.ndarray, t_ns: np.ndarray, addr: np.ndarray, size: np.ndarray,
            rounded: np.ndarray, device: np.ndarray, end: int) -> None:
        """The events up to ``end`` (exclusive). The arrays must be C-contiguous (the reader's and
        ``Events``' are; numba's pass also takes strided ones): a BufferError says so otherwise."""
        self._table.run(self.state, op, seq, t_ns, addr, size, rounded, device, self.keep.view(np.uint8),
                        self.mate, self.counts, self.first, self.found, self.max_request, self.limit,
                        self.checks, int(end))

    def finish(self, op: np.ndarray, addr: np.ndarray, device: np.ndarray) -> None:
        """After the last event: the frees of no live allocation counted by kind (numba; rare)."""
        if self.state[PassState.UNPAIRED]:
            from tracekit.trace._kernels import classify_unpaired

            classify_unpaired(op, addr, device, self.keep, self.counts, self.first)


def new_read_pass(keep: np.ndarray, mate: np.ndarray, counts: np.ndarray, first: np.ndarray,
                  found: np.ndarray, max_request: int | np.integer, limit: int | np.integer,
                  checks: bool) -> PassLike:
    """The pass: the C one where it was built, else numba's (``_kernels.ReadPass``)."""
    if _C is not None:
        return CReadPass(keep, mate, counts, first, found, max_request, limit, checks)
    from tracekit.trace._kernels import ReadPass

    run: ReadPass = ReadPass(keep, mate, counts, first, found, max_request, limit, checks)
    return run


def read_pass(op: np.ndarray, seq: np.ndarray, t_ns: np.ndarray, addr: np.ndarray, size: np.ndarray,
              rounded: np.ndarray, device: np.ndarray, keep: np.ndarray, mate: np.ndarray, counts: np.ndarray,
              first: np.ndarray, found: np.ndarray, max_request: int | np.integer, limit: int | np.integer,
              checks: bool) -> None:
    """``_kernels.read_pass`` over every event, on the pass ``new_read_pass`` gives."""
    run = new_read_pass(keep, mate, counts, first, found, max_request, limit, checks)
    run.run(op, seq, t_ns, addr, size, rounded, device, len(op))
    run.finish(op, addr, device)
