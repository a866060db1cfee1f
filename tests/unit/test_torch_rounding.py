"""PyTorch's round_size, checked on worked examples and by properties."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from tracekit.sim.torch_rules import divisions_from_settings, round_size

MiB = 1 << 20
sizes = st.integers(min_value=0, max_value=1 << 40)
divs = st.lists(st.sampled_from([0, 1, 2, 4, 8, 16]), min_size=16, max_size=16)


def test_worked_examples() -> None:
    s = np.array([0, 1, 511, 512, 513, 5 * MiB + 1, 4 * MiB], np.uint64)
    assert round_size(s).tolist() == [512, 512, 512, 512, 1024, 5 * MiB + 512, 4 * MiB]
    d4 = np.full(16, 4, np.uint64)
    # 5 MiB + 1 with 4 divisions: step = 4 MiB / 4 = 1 MiB -> 6 MiB; a power of two stays.
    assert round_size(np.array([5 * MiB + 1, 4 * MiB, 3000, 2048], np.uint64), d4).tolist() == [
        6 * MiB, 4 * MiB, 3072, 2048]


def test_settings_dict_is_read_by_interval() -> None:
    keys = [str(1 << i) for i in range(16)]
    d = divisions_from_settings({"roundup_power2_divisions": dict(zip(keys, [0] * 8 + [1, 2, 4, 8] + [8] * 4,
                                                                         strict=True))})
    assert d.tolist() == [0] * 8 + [1, 2, 4, 8] + [8] * 4
    assert divisions_from_settings(None).tolist() == [0] * 16


@given(st.lists(sizes, min_size=1, max_size=50), divs)
def test_properties(xs: list[int], d: list[int]) -> None:
    s = np.array(sorted(xs), np.uint64)
    dv = np.array(d, np.uint64)
    r = round_size(s, dv)
    assert np.all(r >= s) and np.all(r % 512 == 0)
    assert np.all(np.diff(r.astype(np.int64)) >= 0)  # monotone
    assert np.array_equal(round_size(r, dv), r)  # idempotent
