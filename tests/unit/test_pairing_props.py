"""The reader's pairing pass against a plain Python pairing, on random histories with every fault.

The compiled pass (``tracekit.trace._kernels.read_pass``) keeps only the live allocations in its
table and decides after the pass whether a free of no live allocation is a double free (its address
was allocated before it) or a free of an address never allocated. The reference here keeps every
address it has seen, as the pass did before, with a "freed" mark: the two must agree on what is kept,
every free's malloc, the counts of each issue and the first event of each.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.trace import _kernels, readpass
from tracekit.trace.issues import IssueKind
from tracekit.trace.schema import Op

# Both passes: numba's, and the C one where the package was built with it (``trace.readpass``).
PASSES = [pytest.param(_kernels.read_pass, id="numba"),
          pytest.param(readpass.read_pass, id="c", marks=pytest.mark.skipif(
              not readpass.COMPILED,
              reason="tracekit.trace._readpass was not built (no C compiler at install)"))]

FREED = -1


Pairing = tuple[list[bool], list[int], dict[int, int], dict[int, int]]  # keep, mate, counts, first


def _reference(op: np.ndarray, addr: np.ndarray, device: np.ndarray) -> Pairing:
    n = len(op)
    keep, mate = [True] * n, [-1] * n
    counts: dict[int, int] = {}
    first: dict[int, int] = {}
    table: dict[tuple[int, bool, int], int] = {}

    def flag(kind: IssueKind, i: int) -> None:
        keep[i] = False
        counts[kind] = counts.get(kind, 0) + 1
        first.setdefault(kind, i)

    for i in range(n):
        o = int(op[i])
        if o == Op.OOM:
            continue
        seg = o in (Op.SEGMENT_ALLOC, Op.SEGMENT_FREE)
        key = (int(device[i]), seg, int(addr[i]))
        seen = key in table
        live = seen and table[key] != FREED
        if o in (Op.MALLOC, Op.SEGMENT_ALLOC):
            if live:
                flag(IssueKind.SEGMENT_ALLOC_LIVE if seg else IssueKind.MALLOC_LIVE, i)
                continue
            table[key] = i
        elif live:
            mate[i], mate[table[key]] = table[key], i
            table[key] = FREED
        elif seg:
            flag(IssueKind.SEGMENT_DOUBLE_FREE if seen else IssueKind.SEGMENT_FREE_NOT_LIVE, i)
        else:
            flag(IssueKind.DOUBLE_FREE if seen else IssueKind.FREE_NOT_LIVE, i)
    return keep, mate, counts, first


def _compiled(read_pass: Callable[..., None], op: np.ndarray, addr: np.ndarray,
              device: np.ndarray) -> Pairing:
    n = len(op)
    keep, mate = np.empty(n, np.bool_), np.empty(n, np.int64)
    counts, first = np.zeros(len(IssueKind), np.int64), np.full(len(IssueKind), -1, np.int64)
    none = np.zeros(0, np.uint64)
    read_pass(op, np.arange(n, dtype=np.uint64), none.view(np.int64), addr, none, none, device, keep, mate,
              counts, first, np.zeros(0, np.int64), np.uint64(0), np.int64(0), False)
    return (keep.tolist(), mate.tolist(), {k: int(counts[k]) for k in IssueKind if counts[k]},
            {k: int(first[k]) for k in IssueKind if first[k] >= 0})


@pytest.mark.parametrize("read_pass", PASSES)
@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(0, 3000),
       addresses=st.sampled_from([4, 64, 5000, 10**6]), devices=st.integers(1, 3), segments=st.booleans())
def test_the_pass_pairs_and_flags_as_the_reference(read_pass: Callable[..., None], seed: int, n: int,
                                                   addresses: int, devices: int, segments: bool) -> None:
    """Random rows over a pool of ``addresses`` addresses (few: many double frees and mallocs at
    live addresses; many: mostly frees of addresses never allocated and a table that must grow and
    shrink), mallocs weighted so that most frees find their block."""
    rng = np.random.default_rng(seed)
    ops = [Op.MALLOC, Op.FREE, Op.OOM] + ([Op.SEGMENT_ALLOC, Op.SEGMENT_FREE] if segments else [])
    weights = np.array([5, 4, 0.2] + ([0.5, 0.4] if segments else []))
    op = rng.choice(np.array(ops, np.int8), size=n, p=weights / weights.sum())
    addr = (rng.integers(1, addresses + 1, size=n).astype(np.uint64) << np.uint64(8))
    device = rng.integers(0, devices, size=n).astype(np.int16)
    # a share of frees aimed at the last allocations, so that pairs are common at any pool size
    for i in np.flatnonzero(op == Op.FREE)[::2]:
        back = i - int(rng.integers(1, 20))
        if back >= 0 and op[back] == Op.MALLOC:
            addr[i], device[i] = addr[back], device[back]
    assert _compiled(read_pass, op, addr, device) == _reference(op, addr, device)


@pytest.mark.parametrize("read_pass", PASSES)
def test_a_table_that_grows_past_its_first_slots_and_empties_again(read_pass: Callable[..., None]) -> None:
    """100,000 blocks live at once at addresses of their own, all freed, again at the same addresses:
    every free finds its malloc, nothing is flagged."""
    k = 100_000
    addr = np.concatenate([np.arange(1, k + 1, dtype=np.uint64) << np.uint64(20)] * 4)
    op = np.concatenate([np.full(k, Op.MALLOC, np.int8), np.full(k, Op.FREE, np.int8)] * 2)
    keep, mate, counts, first = _compiled(read_pass, op, addr, np.zeros(len(op), np.int16))
    assert all(keep) and not counts and not first
    assert mate[:k] == list(range(k, 2 * k)) and mate[2 * k:3 * k] == list(range(3 * k, 4 * k))
