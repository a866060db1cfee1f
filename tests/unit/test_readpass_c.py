"""The reader's pass compiled ahead of time (``tracekit.trace._readpass``, in C) against numba's
(``tracekit.trace._kernels.read_pass``), on random event sequences with every fault the pass finds.

The two must write the same: ``keep``, ``mate``, each issue's count and first event, each ``Found``
fault's first event, the ``rounded`` sizes filled in, and the pass's state (live and reserved bytes,
where the totals first reached the limit), whether the events come in one call or a window at a time,
with the checks or without. Skipped, saying why, where the package was built without a C compiler
(the numba pass is then the reader's, and the other tests run on it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracekit.trace._kernels import ReadPass
from tracekit.trace.issues import Found, IssueKind, PassState
from tracekit.trace.schema import Op
from tracekit.trace.validate import read_only

try:
    import tracekit.trace._readpass as _readpass  # type: ignore[import-not-found]
except ImportError:
    _readpass = None

from tracekit.trace.readpass import CReadPass

pytestmark = pytest.mark.skipif(_readpass is None, reason="tracekit.trace._readpass was not built (no C "
                                "compiler at install): the reader runs numba's pass")
ROOT = Path(__file__).resolve().parents[2]


def _events(draw: st.DrawFn) -> dict[str, np.ndarray]:
    """A history over a few addresses and two devices: pairs, double frees, frees never allocated,
    allocations of live addresses, OOMs, seq and t_ns out of order, huge and zero roundings,
    blocks near the end of the address space."""
    n = draw(st.integers(0, 300))
    ops = draw(st.lists(st.sampled_from([int(o) for o in Op]), min_size=n, max_size=n))
    near_end = np.uint64(2**64 - 4096)
    addr_pool = [0x1000, 0x2000, 0x3000, 0x100000, int(near_end)] + [0x10000 * k for k in range(1, 12)]
    addrs = draw(st.lists(st.sampled_from(addr_pool), min_size=n, max_size=n))
    sizes = draw(st.lists(st.sampled_from([0, 1, 512, 4096, 1 << 20, 1 << 40, 1 << 60, 1 << 61, 2**64 - 1]),
                          min_size=n, max_size=n))
    rounded_zero = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    devices = draw(st.lists(st.sampled_from([0, 0, 0, 1]), min_size=n, max_size=n))
    seq_steps = draw(st.lists(st.sampled_from([1, 1, 1, 1, 0, -1]), min_size=n, max_size=n))  # 0: a repeat
    t_steps = draw(st.lists(st.sampled_from([3, 3, 3, 0, -2]), min_size=n, max_size=n))  # 0: a tie, allowed
    seq = np.cumsum(np.array(seq_steps, np.int64)) + 1000
    t_ns = np.cumsum(np.array(t_steps, np.int64))
    size = np.array(sizes, np.uint64)
    rounded = np.where(np.array(rounded_zero, bool), np.uint64(0), size)
    return {"op": np.array(ops, np.int8), "seq": seq.astype(np.uint64), "t_ns": t_ns,
            "addr": np.array(addrs, np.uint64), "size": size, "rounded": rounded.astype(np.uint64),
            "device": np.array(devices, np.int16)}


@st.composite
def histories(draw: st.DrawFn) -> dict[str, np.ndarray]:
    return _events(draw)


def _run(make: type, ev: dict[str, np.ndarray], checks: bool, windows: list[int], limit: int) -> tuple:
    n = len(ev["op"])
    keep, mate = np.empty(n, np.bool_), np.empty(n, np.int64)
    counts, first = np.zeros(len(IssueKind), np.int64), np.full(len(IssueKind), -1, np.int64)
    found = np.full(len(Found), -1, np.int64)
    rounded = ev["rounded"].copy()
    op, seq, t_ns, addr, size, device = read_only(ev["op"], ev["seq"], ev["t_ns"], ev["addr"], ev["size"],
                                                  ev["device"])
    run = make(keep, mate, counts, first, found, np.uint64(1 << 60), np.int64(limit), checks)
    for end in [*windows, n]:
        run.run(op, seq, t_ns, addr, size, rounded, device, min(end, n))
    run.finish(op, addr, device)
    return (keep.tolist(), mate.tolist(), counts.tolist(), first.tolist(), found.tolist(), rounded.tolist(),
            run.state.tolist())


@settings(max_examples=300, deadline=None)
@given(histories(), st.booleans(), st.lists(st.integers(0, 300), max_size=4),
       st.sampled_from([1 << 62, 1 << 21, 4096, 1024, 5000]))
def test_the_c_pass_writes_what_the_numba_pass_writes(ev: dict[str, np.ndarray], checks: bool,
                                                      windows: list[int], limit: int) -> None:
    windows = sorted(windows)
    assert _run(CReadPass, ev, checks, windows, limit) == _run(ReadPass, ev, checks, windows, limit)


def test_a_table_grown_many_times_pairs_every_free() -> None:
    """50,000 blocks live at once (the table grows from 4,096 slots to 131,072), then freed in another
    order: every free finds its malloc, the live bytes go back to 0."""
    rng = np.random.default_rng(1)
    k = 50_000
    addr = (np.arange(k, dtype=np.uint64) + np.uint64(1)) << np.uint64(9)
    order = rng.permutation(k)
    ev = {"op": np.r_[np.full(k, Op.MALLOC, np.int8), np.full(k, Op.FREE, np.int8)],
          "seq": np.arange(2 * k, dtype=np.uint64), "t_ns": np.arange(2 * k, dtype=np.int64),
          "addr": np.r_[addr, addr[order]], "size": np.full(2 * k, 512, np.uint64),
          "rounded": np.full(2 * k, 512, np.uint64), "device": np.zeros(2 * k, np.int16)}
    keep, mate, counts, *_, state = _run(CReadPass, ev, True, [], 1 << 62)
    assert all(keep) and not any(counts)
    assert mate[:k] == (k + np.argsort(order)).tolist()
    assert state[PassState.LIVE_BYTES] == 0 and state[PassState.USED] == 0 and state[PassState.AT] == 2 * k


def test_short_arrays_are_refused_not_read_past() -> None:
    c = CReadPass(np.empty(2, np.bool_), np.empty(2, np.int64), np.zeros(len(IssueKind), np.int64),
                  np.full(len(IssueKind), -1, np.int64), np.full(len(Found), -1, np.int64), 1 << 60, 1 << 62,
                  True)
    two, one = np.zeros(2, np.uint64), np.zeros(1, np.uint64)
    with pytest.raises(ValueError, match="shorter than the events"):
        c.run(np.zeros(2, np.int8), two, two.view(np.int64), one, two, two.copy(), np.zeros(2, np.int16), 2)
    with pytest.raises(TypeError, match="device must be a flat array of 2-byte items"):
        c.run(np.zeros(2, np.int8), two, two.view(np.int64), two, two, two.copy(), np.zeros(2, np.int64), 2)


def test_the_reader_runs_the_c_pass_and_numba_only_when_asked() -> None:
    """A fresh process reads a committed trace without loading the numba pass before the read returns
    (the verbs' kernels load it beside); ``TRACEKIT_READ_PASS=numba`` gives numba's pass, same answer."""
    code = ("import sys; from tracekit.trace import read_trace; from tracekit.trace import readpass; "
            "t = read_trace(sys.argv[1]); "
            "print(readpass.COMPILED, len(t.events), int(t.mate.sum()), t.dropped, "
            "[i.describe() for i in t.issues])")
    trace = str(ROOT / "traces" / "cupy-mlp.parquet")
    out = {}
    for how in ("", "numba"):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TRACEKIT_READ_PASS": how}
        p = subprocess.run([sys.executable, "-c", code, trace], capture_output=True, text=True, env=env,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        out[how] = p.stdout.split(" ", 1)
    assert out[""][0] == "True" and out["numba"][0] == "False"
    assert out[""][1] == out["numba"][1]


@pytest.mark.parametrize(("op", "limit", "want"), [
    ([Op.MALLOC, Op.MALLOC, Op.FREE], 1024, (Found.OVER_LIVE, 1)),  # 512 + 512 reaches 1,024
    ([Op.SEGMENT_ALLOC, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE], 1024, (Found.OVER_RESERVED, 1)),
    ([Op.MALLOC, Op.MALLOC, Op.FREE], 1025, None),
])
def test_the_totals_reach_the_limit_at_equality(op: list[Op], limit: int,
                                                want: tuple[Found, int] | None) -> None:
    """Worked by hand: the first event whose running total is the limit or more, in both passes."""
    ev = {"op": np.array(op, np.int8), "seq": np.arange(3, dtype=np.uint64),
          "t_ns": np.arange(3, dtype=np.int64),
          "addr": np.array([0x1000, 0x2000, 0x1000], np.uint64), "size": np.full(3, 512, np.uint64),
          "rounded": np.full(3, 512, np.uint64), "device": np.zeros(3, np.int16)}
    for make in (CReadPass, ReadPass):
        found = _run(make, ev, True, [], limit)[4]
        assert [(Found(k), i) for k, i in enumerate(found) if i >= 0] == ([want] if want else [])


def test_a_probe_run_that_wraps_past_the_tables_end() -> None:
    """0xbfd00 and 0x1acc00 both hash to the last of the 4,096 slots and 0xecf00 to slot 0: the
    second and third wrap to the start, and freeing the first must move them back across the end."""
    addr = np.array([0xBFD00, 0x1ACC00, 0xECF00] * 2, np.uint64)
    ev = {"op": np.array([Op.MALLOC] * 3 + [Op.FREE] * 3, np.int8), "seq": np.arange(6, dtype=np.uint64),
          "t_ns": np.arange(6, dtype=np.int64), "addr": addr, "size": np.full(6, 512, np.uint64),
          "rounded": np.full(6, 512, np.uint64), "device": np.zeros(6, np.int16)}
    for make in (CReadPass, ReadPass):
        keep, mate, counts = _run(make, ev, True, [], 1 << 62)[:3]
        assert all(keep) and not any(counts) and mate == [3, 4, 5, 0, 1, 2]


def test_counts_too_short_for_the_issue_codes_are_refused() -> None:
    c = CReadPass(np.empty(1, np.bool_), np.empty(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                  np.full(len(Found), -1, np.int64), 1 << 60, 1 << 62, False)
    one = np.zeros(1, np.uint64)
    with pytest.raises(ValueError, match="shorter than the events"):
        c.run(np.zeros(1, np.int8), one, one.view(np.int64), one, one, one.copy(), np.zeros(1, np.int16), 1)


def test_a_negative_device_is_a_device_like_any_other() -> None:
    """Device -1's segment tag (-1 · 2 + 1) was the empty slot's mark: its allocations vanished from the
    table and their frees were dropped unreported. Both passes now pair them."""
    ev = {"op": np.array([Op.SEGMENT_ALLOC, Op.MALLOC, Op.FREE, Op.SEGMENT_FREE], np.int8),
          "seq": np.arange(4, dtype=np.uint64), "t_ns": np.arange(4, dtype=np.int64),
          "addr": np.array([0x1000, 0x1000, 0x1000, 0x1000], np.uint64), "size": np.full(4, 512, np.uint64),
          "rounded": np.full(4, 512, np.uint64), "device": np.full(4, -1, np.int16)}
    for make in (CReadPass, ReadPass):
        keep, mate, counts = _run(make, ev, True, [], 1 << 62)[:3]
        assert all(keep) and not any(counts) and mate == [3, 2, 1, 0]
