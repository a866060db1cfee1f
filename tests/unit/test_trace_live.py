"""The one 512-byte rounding and live-bytes helper (tracekit.trace.live), worked by hand."""

from __future__ import annotations

import numpy as np

from tracekit.trace.live import UNIT, live_bytes, paired_frees, round_up
from tracekit.trace.schema import Op


def test_round_up_is_the_ceiling_multiple_for_ints_signed_and_unsigned_arrays() -> None:
    assert UNIT == 512
    assert [round_up(n) for n in (0, 1, 511, 512, 513)] == [0, 512, 512, 512, 1024]
    assert round_up(3 << 20, 2 << 20) == 4 << 20
    signed = np.array([0, 1, 512, 1000], np.int64)
    unsigned = signed.astype(np.uint64)
    assert round_up(signed).tolist() == [0, 512, 512, 1024] and round_up(signed).dtype == np.int64
    assert round_up(unsigned).tolist() == [0, 512, 512, 1024] and round_up(unsigned).dtype == np.uint64
    assert round_up(np.uint64(513)) == np.uint64(1024)
    top = np.array([np.iinfo(np.int64).max - 100], np.int64)  # the signed form cannot overflow there
    assert round_up(top, 1).tolist() == top.tolist()


def test_live_bytes_counts_requests_until_their_free() -> None:
    """malloc 100 (512), malloc 600 (1024), free the first, an unpaired free, malloc 1 (512):
    live = 512, 1536, 1024, 1024, 1536."""
    op = np.array([Op.MALLOC, Op.MALLOC, Op.FREE, Op.FREE, Op.MALLOC], np.int8)
    size = np.array([100, 600, 100, 5, 1], np.uint64)
    mate = np.array([2, -1, 0, -1, -1], np.int64)
    frees = paired_frees(op, mate)
    assert frees.tolist() == [False, False, True, False, False]
    live = live_bytes(round_up(size), op == Op.MALLOC, frees, mate)
    assert live.dtype == np.int64
    assert live.tolist() == [512, 1536, 1024, 1024, 1536]
    # a request not counted adds nothing, and neither does its free when it is not freed here
    none = live_bytes(round_up(size), np.array([False, True, False, False, False]), np.zeros(5, bool), mate)
    assert none.tolist() == [0, 1024, 1024, 1024, 1024]
