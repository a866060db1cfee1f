"""Handled OOMs modelled as what the program did instead, with answers worked out by hand.

An ``oom`` row the program survived (every one but the fatal OOM) is not a request the
program needed: it lives no longer than the retry that replaced it, or not at all. The
live-bytes bound, the top call-sites at the peak, the replays and the what-if search
all follow that; the fatal OOM stays a request the program needed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tracekit.advise.capacity import live_curve, lower_bound, search
from tracekit.advise.run import top_sites_at_peak
from tracekit.sim.base import SimConfig, Status
from tracekit.sim.engine import replay
from tracekit.sim.prepare import prepare
from tracekit.trace import Events, Op, Source, TraceMeta, read_trace, write_trace
from tracekit.trace.outcome import handled_rows

MiB = 1 << 20
M, OOM, F = Op.MALLOC, Op.OOM, Op.FREE
SITES = ("a.py:1", "b.py:2", "c.py:3")


def build(tmp: Path, name: str, rows: list[tuple[Op, int, int]], sites: tuple[str, ...]) -> Path:
    """rows: (op, MiB, site index); a free frees the latest malloc of its size."""
    op = np.array([r[0] for r in rows], np.int8)
    size = np.array([r[1] for r in rows], np.uint64) * MiB
    addr = np.where(op == OOM, 0, 0x1000_0000 + (size // MiB) * 0x100_0000).astype(np.uint64)
    rounded = np.where(op == M, size, 0).astype(np.uint64)
    ev = Events.build(op, size, addr=addr, rounded=rounded, site=np.array([r[2] for r in rows], np.int32),
                      sites=sites)
    return write_trace(tmp / f"{name}.parquet", TraceMeta.new(Source.SYNTHETIC), ev)


@pytest.fixture
def retried(tmp_path: Path) -> Path:
    """A 4 MiB at a; an 8 MiB request at b fails and is retried smaller (2 MiB at b), used and
    freed; then 3 MiB at c. Live: 4, 4, 6, 4, 7 MiB; the failed request never counts."""
    return build(tmp_path, "retried", [(M, 4, 0), (OOM, 8, 1), (M, 2, 1), (F, 2, 1), (M, 3, 2)], SITES)


@pytest.fixture
def unreplaced(tmp_path: Path) -> Path:
    """4 MiB live; a 16 MiB request fails and nothing replaces it; the program goes on with 1 MiB."""
    return build(tmp_path, "unreplaced", [(M, 4, 0), (OOM, 16, 1), (M, 1, 2)], SITES)


@pytest.fixture
def fatal(tmp_path: Path) -> Path:
    """4 MiB, a handled 8 MiB failure, 2 MiB, then a 32 MiB request the program died of."""
    return build(tmp_path, "fatal", [(M, 4, 0), (OOM, 8, 1), (M, 2, 1), (OOM, 32, 2)], SITES)


def test_handled_rows_are_every_oom_but_the_fatal_one(retried: Path, fatal: Path):
    assert handled_rows(read_trace(retried).events, {}).tolist() == [False, True, False, False, False]
    assert handled_rows(read_trace(fatal).events, {}).tolist() == [False, True, False, False]


def test_a_retried_request_is_not_live(retried: Path):
    tr = read_trace(retried)
    assert (live_curve(tr) // MiB).tolist() == [4, 4, 6, 4, 7]
    assert lower_bound(tr) == 7 * MiB  # counting the failed 8 MiB as live forever gave 15 MiB
    assert [(s.site, s.bytes) for s in top_sites_at_peak(tr)] == [("a.py:1", 4 * MiB), ("c.py:3", 3 * MiB)]


def test_a_request_nothing_replaced_is_not_live(unreplaced: Path):
    tr = read_trace(unreplaced)
    assert lower_bound(tr) == 5 * MiB
    assert [s.site for s in top_sites_at_peak(tr)] == ["a.py:1", "c.py:3"]


def test_the_fatal_request_stays_live(fatal: Path):
    assert lower_bound(read_trace(fatal)) == (4 + 2 + 32) * MiB


@pytest.mark.parametrize(("policy", "scale"), [("first-fit", 1), ("best-fit", 1), ("buddy", 1), ("cupy", 1),
                                               ("torch", 16)])
def test_the_replay_goes_on_past_a_handled_failure(tmp_path: Path, policy: str, scale: int):
    """Under 10 MiB the 8 MiB request fails again (4 + 8 > 10), as in the program, which went on:
    the replay goes on too and the rest fits (4 + 2, then 4 + 3; buddy: 4 + 2 + 4 blocks).
    PyTorch puts requests under 10 MiB in 20 MiB segments: its trace is 16 times larger
    (64 + 128 > 160 MiB fails; 64 + 32 + 48 fits)."""
    rows = [(M, 4 * scale, 0), (OOM, 8 * scale, 1), (M, 2 * scale, 1), (F, 2 * scale, 1), (M, 3 * scale, 2)]
    tr = read_trace(build(tmp_path, "scaled", rows, SITES))
    s = replay(tr, policy, SimConfig(capacity=10 * scale * MiB)).summary
    assert s.oom is None and s.handled_ooms == 1 and s.oom_count == 0
    stop = replay(tr, policy, SimConfig(capacity=10 * scale * MiB, stop_at_first_oom=True)).summary
    assert stop.oom is not None and stop.oom.seq == 1 and stop.handled_ooms == 0


@pytest.mark.parametrize("policy", ["first-fit", "buddy", "cupy", "torch"])
def test_a_served_attempt_lives_in_place_of_its_retry(retried: Path, unreplaced: Path, policy: str):
    """With room for it the 8 MiB request is served and used in place of the 2 MiB retry,
    until the retry's free: the peak of live bytes is 4 + 8 = 12 MiB (the retry is not
    made). The 16 MiB request nothing replaced is served and released at once: 4 + 1 = 5 MiB."""
    assert prepare(read_trace(retried)).replaced_by.tolist() == [-1, 2, -1, -1, -1]
    r = replay(read_trace(retried), policy, SimConfig(capacity=64 * MiB))
    assert r.summary.oom is None and r.summary.handled_ooms == 0
    assert r.summary.peak_live_bytes == 12 * MiB
    assert r.run.status.tolist() == [Status.DONE, Status.TRIED, Status.DONE, Status.DONE, Status.DONE]
    assert r.run.addr[2] == r.run.addr[1]  # the retry is the served block
    u = replay(read_trace(unreplaced), policy, SimConfig(capacity=64 * MiB)).summary
    assert u.oom is None and u.peak_live_bytes == 5 * MiB


def test_replay_follows_the_program_to_the_fatal_oom(fatal: Path):
    s = replay(read_trace(fatal), "first-fit", SimConfig(capacity=10 * MiB)).summary
    assert s.oom is not None and s.oom.seq == 3 and s.handled_ooms == 1


def test_whatif_needs_room_for_what_the_program_did(retried: Path):
    """First fit: at 8 MiB the 8 MiB attempt fails (handled), 2 MiB goes to [4, 6), 3 MiB to
    [4, 7): it fits; at 6 MiB the 3 MiB block cannot go above the 4 MiB one. Before, the
    failed request counted: a bound of 15 MiB and a smallest heap of 16 MiB."""
    fit = search(read_trace(retried), "first-fit")
    assert fit.lower_bound == 7 * MiB and fit.min_capacity == 8 * MiB
