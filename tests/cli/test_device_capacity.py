"""Capacity planning and argument checking for device replay: plain functions, no GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from tracekit.cli.app import app
from tracekit.device.capacity import DRIVER_SLACK, GRANULARITY, Allocator, CapacityPlan, plan_capacity
from tracekit.device.command import check_args
from tracekit.errors import UsageError

GiB = 1 << 30
MiB = 1 << 20
H200_FREE, H200_TOTAL = 149_557_477_376, 150_109_880_320  # measured after context creation


def test_no_capacity_takes_nothing() -> None:
    assert plan_capacity(Allocator.CUDA, None, H200_FREE, H200_TOTAL) == CapacityPlan(None, 0, None)


def test_cupy_capacity_is_the_pool_limit() -> None:
    plan = plan_capacity(Allocator.CUPY, 16 * GiB, H200_FREE, H200_TOTAL)
    assert plan == CapacityPlan(16 * GiB, 0, 16 * GiB)


@pytest.mark.parametrize("alloc", [Allocator.CUDA, Allocator.CUPY_ASYNC])
def test_ballast_for_16gib_on_an_h200(alloc: Allocator) -> None:
    plan = plan_capacity(alloc, 16 * GiB, H200_FREE, H200_TOTAL)
    # 149,557,477,376 - 17,179,869,184 - 4 MiB = 132,373,413,888 = 63,120.56 x 2 MiB -> 63,120
    assert plan.ballast_bytes == 63_120 * GRANULARITY
    assert plan.pool_limit is None
    left = H200_FREE - plan.ballast_bytes
    assert 16 * GiB + DRIVER_SLACK <= left < 16 * GiB + DRIVER_SLACK + GRANULARITY


@given(
    free=st.integers(min_value=1, max_value=200 * GiB),
    frac=st.floats(min_value=0.0, max_value=1.0),
    alloc=st.sampled_from(list(Allocator)),
)
def test_plan_leaves_at_least_capacity_free(free: int, frac: float, alloc: Allocator) -> None:
    cap = max(1, int(free * frac))
    plan = plan_capacity(alloc, cap, free, free + GiB)
    assert plan.ballast_bytes % GRANULARITY == 0
    if alloc in (Allocator.CUPY, Allocator.TORCH, Allocator.RMM_POOL):  # a pool limit limits; nothing taken
        assert plan.ballast_bytes == 0 and plan.pool_limit == cap
    elif plan.ballast_bytes:
        assert cap + DRIVER_SLACK <= free - plan.ballast_bytes < cap + DRIVER_SLACK + GRANULARITY
    else:  # within the driver's slack of the free memory: nothing to take
        assert free - cap < DRIVER_SLACK + GRANULARITY


@pytest.mark.parametrize("alloc", list(Allocator))
def test_capacity_above_free_is_refused(alloc: Allocator) -> None:
    with pytest.raises(UsageError, match=r"more than the device's free memory.*nothing was allocated"):
        plan_capacity(alloc, H200_FREE + 1, H200_FREE, H200_TOTAL)


def test_capacity_equal_to_free_takes_no_ballast() -> None:
    assert plan_capacity(Allocator.CUDA, H200_FREE, H200_FREE, H200_TOTAL).ballast_bytes == 0


def test_zero_capacity_is_refused() -> None:
    with pytest.raises(UsageError, match="must be positive"):
        plan_capacity(Allocator.CUDA, 0, H200_FREE, H200_TOTAL)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"device": -1}, "device ordinal"),
        ({"allocator": "malloc"}, "unknown --allocator 'malloc'"),
        ({"capacity": "lots"}, "invalid --capacity"),
        ({"capacity": "0"}, "must be positive"),
    ],
)
def test_check_args_rejects(kw: dict, match: str) -> None:
    args = {"device": 0, "allocator": "cuda", "capacity": None, **kw}
    with pytest.raises(UsageError, match=match):
        check_args(**args)


def test_check_args_accepts() -> None:
    alloc, cap = check_args(0, "cupy-async", "1.5GB")
    assert alloc is Allocator.CUPY_ASYNC and cap == 1_500_000_000


def test_cli_bad_capacity_exits_2_before_touching_the_gpu(tmp_path) -> None:
    trace = tmp_path / "t.parquet"
    trace.write_bytes(b"")  # never read: the capacity is checked first
    r = CliRunner().invoke(app, ["replay", str(trace), "--device", "0", "--capacity", "huge"])
    assert r.exit_code == 2, r.output
    assert "invalid --capacity 'huge'" in r.output


def _has_cupy() -> bool:
    try:
        import cupy  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.skipif(_has_cupy(), reason="checks the message on a machine without CuPy")
def test_cli_without_cupy_says_so_in_one_line(tmp_path) -> None:
    import numpy as np

    from tracekit.trace import Events, Source, TraceMeta, write_trace

    trace = tmp_path / "t.parquet"
    write_trace(trace, TraceMeta.new(Source.SYNTHETIC),
                Events.build(np.array([0, 1], np.int8), np.array([512, 512], np.uint64),
                             addr=np.array([4096, 4096], np.uint64)))
    p = subprocess.run([sys.executable, "-m", "tracekit", "replay", str(trace), "--device", "0"],
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.startswith("tracekit: error: CuPy is not importable")
    assert "device replay needs CuPy and a GPU" in p.stderr
    assert "Traceback" not in p.stderr


def test_sigterm_during_a_replay_is_interrupted_exiting_143_at_the_loops_check() -> None:
    """The device loop's signals are tracekit's one stop: held until ``check()``, then
    ``Interrupted`` exiting 143 for SIGTERM (130 for SIGINT), as for every verb."""
    import os
    import signal

    from tracekit.device.capacity import deferred_signals
    from tracekit.errors import Interrupted

    with pytest.raises(Interrupted) as info, deferred_signals() as pending:
        os.kill(os.getpid(), signal.SIGTERM)  # held: the loop goes on to its safe point
        pending.check()
        raise AssertionError("check() raises the held signal")
    assert info.value.exit_code == 143
