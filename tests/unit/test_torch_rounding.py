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


def _old_floor_log2(x: np.ndarray) -> np.ndarray:
    """The shift-and-compare ``_floor_log2`` of before issue 45 (the reference the fast one must equal)."""
    x = np.asarray(x, dtype=np.uint64)
    lg = np.zeros(x.shape, dtype=np.uint64)
    for shift in (32, 16, 8, 4, 2, 1):
        sh = np.uint64(shift)
        big = np.right_shift(x, sh) > 0
        x = np.where(big, np.right_shift(x, sh), x)
        lg = lg + np.where(big, sh, np.uint64(0))
    return lg


def _old_round_size(size: np.ndarray, divisions: np.ndarray | None = None) -> np.ndarray:
    """``round_size`` as it was before issue 45, every size through every step."""
    s = np.asarray(size, dtype=np.uint64)
    out = ((s + np.uint64(511)) // np.uint64(512)) * np.uint64(512)
    out = np.where(s < 512, np.uint64(512), out)
    if divisions is None or not np.any(divisions > 1):
        return out.astype(np.uint64)
    lg = _old_floor_log2(np.maximum(s, np.uint64(1)))
    idx = np.clip(lg.astype(np.int64) - 20, 0, 15)
    d = np.asarray(divisions, dtype=np.uint64)[idx]
    use = (s >= 512) & (d > 1) & (s > np.uint64(512) * d)
    if not np.any(use):
        return out.astype(np.uint64)
    su, lgu, du = s[use], lg[use], d[use]
    p2floor = np.left_shift(np.uint64(1), lgu)
    step = np.right_shift(p2floor, _old_floor_log2(du))
    safe_step = np.maximum(step, np.uint64(1))
    floor = su & ~(safe_step - np.uint64(1))
    up = np.where(floor == su, su, floor + safe_step)
    up = np.where(step == 0, np.left_shift(p2floor, np.uint64(1)), up)
    out[use] = np.where(su == p2floor, su, up)
    return out.astype(np.uint64)


# Every uint64, with the edges where a double rounds across a power of two made likely.
near_pow2 = st.builds(lambda k, off: max(1, min((1 << k) + off, (1 << 64) - 1)),
                      st.integers(0, 64), st.integers(-1024, 1024))
any_u64 = st.one_of(st.integers(1, (1 << 64) - 1), near_pow2)


@given(st.lists(any_u64, min_size=1, max_size=64))
def test_floor_log2_equals_the_old_one_over_all_uint64(xs: list[int]) -> None:
    from tracekit.sim.torch_rules import _floor_log2

    x = np.array(xs, np.uint64)
    assert _floor_log2(x).tolist() == _old_floor_log2(x).tolist() == [v.bit_length() - 1 for v in xs]


@given(st.lists(st.one_of(st.just(0), any_u64), min_size=1, max_size=64),
       st.lists(st.sampled_from([0, 1, 2, 4, 8, 16, 1 << 20, 1 << 32]), min_size=16, max_size=16),
       st.booleans())
def test_round_size_equals_the_old_one(xs: list[int], d: list[int], no_table: bool) -> None:
    s = np.array(xs, np.uint64)
    dv = None if no_table else np.array(d, np.uint64)
    assert round_size(s, dv).tolist() == _old_round_size(s, dv).tolist()
    assert round_size(s[0], dv).tolist() == _old_round_size(s[0], dv).tolist()  # a 0-d array too


@given(st.lists(st.integers(min_value=0, max_value=(1 << 62) - 1), min_size=1, max_size=64),
       st.lists(st.sampled_from([0, 1, 2, 4, 8, 16, 1 << 20, 1 << 32]), min_size=16, max_size=16))
def test_divisions_never_move_a_request_between_the_pools(xs: list[int], d: list[int]) -> None:
    """The model sizes the trace's groups once for every rounding setting (``_Setup.sized``): a
    rounded size of at most 1 MiB (the small pool) stays so under any divisions, and one above
    stays above. Sizes below 2^62, as the reader admits."""
    from tracekit.sim.policies._torch_kernel import round_sizes

    s = np.array([*xs, MiB - 1, MiB, MiB + 1, MiB - 511, (MiB >> 1) + 1], np.uint64)
    plain = round_sizes(s, np.zeros(16, np.uint64)) <= MiB
    divided = round_sizes(s, np.array(d, np.uint64)) <= MiB
    assert divided.tolist() == plain.tolist()
