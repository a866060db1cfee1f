"""``optional_int``: a field taken if it plainly is an integer, else None (tracekit.inputs)."""

from __future__ import annotations

import pytest

from tracekit.inputs import optional_int


@pytest.mark.parametrize(("value", "expected"), [
    (7, 7), (-3, -3), (2**62, 2**62),  # ints, as they are
    (7.9, 7), (float("nan"), None), (1e30, None),  # finite floats in int64, truncated
    ("12", 12), ("-4", -4), ("", None), ("1.5", None), ("rank0", None),  # launcher variables
    (True, None), (None, None), ([3], None), ({"a": 1}, None),  # not integers at all
])
def test_what_counts_as_an_integer(value: object, expected: int | None) -> None:
    assert optional_int(value) == expected
