"""Synthetic traces: valid v1, exact event counts, deterministic, consistent pairing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.errors import UsageError
from tracekit.synth import Pattern, synthesize
from tracekit.trace import Op, read_trace


@pytest.mark.parametrize("pattern", list(Pattern))
def test_pattern_is_valid_and_exact(tmp_path: Path, pattern: Pattern) -> None:
    out = synthesize(pattern, 30_000, 7, tmp_path / "t.parquet")
    t = read_trace(out, strict=True)  # strict: no inconsistent event at all
    ev = t.events
    assert len(ev) == 30_000
    assert ev.seq.tolist() == list(range(30_000))
    assert np.all(np.diff(ev.t_ns) > 0)
    assert t.meta.extra["synth"] == {"pattern": pattern.value, "events": 30_000, "seed": 7, "stacks": 3000}
    frees = np.flatnonzero(ev.op == Op.FREE)
    # every free returns exactly the rounded size of its malloc
    assert np.all(t.mate[frees] >= 0)
    np.testing.assert_array_equal(ev.size[frees], ev.rounded[t.mate[frees]])


@pytest.mark.parametrize("pattern", list(Pattern))
def test_live_blocks_never_overlap(tmp_path: Path, pattern: Pattern) -> None:
    t = read_trace(synthesize(pattern, 5_000, 3, tmp_path / "t.parquet"))
    ev, live = t.events, {}
    for i in range(len(ev)):
        a = int(ev.addr[i])
        if ev.op[i] == Op.MALLOC:
            end = a + int(ev.rounded[i])
            assert all(end <= s or a >= e for s, e in live.values())
            live[a] = (a, end)
        else:
            del live[a]


def test_same_seed_same_trace(tmp_path: Path) -> None:
    a = read_trace(synthesize(Pattern.RANDOM, 10_000, 1, tmp_path / "a.parquet")).events
    b = read_trace(synthesize(Pattern.RANDOM, 10_000, 1, tmp_path / "b.parquet")).events
    np.testing.assert_array_equal(a.size, b.size)
    np.testing.assert_array_equal(a.t_ns, b.t_ns)


def test_random_sizes_are_log_uniform_within_bounds(tmp_path: Path) -> None:
    ev = read_trace(synthesize(Pattern.RANDOM, 50_000, 2, tmp_path / "t.parquet")).events
    sizes = ev.size[ev.op == Op.MALLOC]
    assert sizes.min() >= 512 and sizes.max() <= 64 << 20
    # log-uniform: the median sits near the geometric mean of the bounds (~181 KiB)
    assert 100 << 10 < np.median(sizes) < 330 << 10


def test_bad_event_count_is_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        synthesize(Pattern.TRAINING, 0, 0, tmp_path / "t.parquet")
    res = CliRunner().invoke(app, ["synth", "-p", "nope", "-o", str(tmp_path / "x.parquet")])
    assert res.exit_code == 2


def test_cli_writes_and_reports_path(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["synth", "-p", "fragmenting", "-n", "1000",
                                   "-o", str(tmp_path / "f.parquet")])
    assert res.exit_code == 0, res.output
    assert f"Wrote {tmp_path / 'f.parquet'}" in res.output


@pytest.mark.parametrize("pattern", list(Pattern))
def test_requests_carry_whole_stacks_whose_innermost_user_frame_is_the_site(tmp_path: Path,
                                                                            pattern: Pattern) -> None:
    from tracekit.trace.stacks import FrameKind

    t = read_trace(synthesize(pattern, 20_000, 5, tmp_path / "t.parquet", stacks=300))
    ev = t.events
    request = (ev.op == Op.MALLOC) | (ev.op == Op.OOM)
    assert np.all(ev.stack[~request] == -1) and np.all(ev.stack[request & (ev.site >= 0)] >= 0)
    used = np.unique(ev.stack[ev.stack >= 0])
    assert 20 <= len(used) <= 300  # leaves drawn from at most 300, a few hot ones and a tail
    for i in np.flatnonzero(request & (ev.site >= 0))[:200]:
        frames = ev.stacks.frames(int(ev.stack[i]))
        assert 8 + 4 + 1 + 1 <= len(frames) <= 39 + 4 + 1 + 3
        assert frames[0].kind is FrameKind.LIBRARY and frames[-1].kind is FrameKind.STDLIB
        user = next(f for f in frames if f.kind is FrameKind.USER)
        assert user.label() == ev.site_name(int(i))


def test_stacks_change_no_other_column_and_zero_means_one_frame_stacks(tmp_path: Path) -> None:
    a = read_trace(synthesize(Pattern.RANDOM, 5_000, 9, tmp_path / "a.parquet", stacks=0)).events
    b = read_trace(synthesize(Pattern.RANDOM, 5_000, 9, tmp_path / "b.parquet")).events
    for name in ("seq", "t_ns", "op", "addr", "size", "rounded", "site"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.stack, a.site)  # the call-sites as one-frame stacks
    assert a.stacks.n_stacks == len(a.sites) and b.stacks.n_stacks > 1000


def test_stacks_out_of_range_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="--stacks must be between 0 and 100,000, got -1"):
        synthesize(Pattern.RANDOM, 10, 0, tmp_path / "t.parquet", stacks=-1)
