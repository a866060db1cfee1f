"""``trace.events.seq_row``: the row of a seq in an ascending seq column, the key in the column's type."""

from __future__ import annotations

import numpy as np
import pytest

from tracekit.trace.events import seq_row


@pytest.mark.parametrize("dtype", [np.uint64, np.int64])
def test_worked_rows(dtype: type[np.generic]) -> None:
    col = np.arange(0, 20, 2, dtype=dtype)  # seqs 0, 2, ..., 18
    assert [seq_row(col, s) for s in (0, 1, 2, 18, 19, 100)] == [0, 1, 1, 9, 10, 10]


def test_a_seq_above_two_to_the_53_is_found_exactly() -> None:
    """Where the key were cast to float, 2^53 + 1 would read as 2^53 and land one row early."""
    col = np.array([2**53, 2**53 + 1, 2**53 + 2], np.uint64)
    assert seq_row(col, 2**53 + 1) == 1
    assert seq_row(np.zeros(0, np.uint64), 5) == 0
