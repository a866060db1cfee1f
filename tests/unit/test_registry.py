"""The policy registry: a policy describes itself, and every verb learns about it from the registry.

A toy policy, a bump allocator that never reuses memory (block k starts where
block k-1 ended, each request rounded up to 512 B; a request fails once the
end would pass the capacity), is registered from this file, outside the
policies package. With the worked trace of three requests of 1000, 512 and
1 B, it places them at 0, 1024 and 1536 and reaches 2048 bytes, so ``whatif``
finds 2 MiB (its smallest step) and a 1536-byte heap fails at the third request.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
from typer.testing import CliRunner

from tracekit.advise.capacity import whatif
from tracekit.cli.app import app
from tracekit.sim import policies
from tracekit.sim.base import Allocator, Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.sim.codes import Kind, Stat, Status
from tracekit.sim.heap import heap_run, heap_stats, round_up
from tracekit.sim.prepare import prepare
from tracekit.trace import Events, Op, Source, Trace, TraceMeta, read_trace, write_trace

runner = CliRunner()


class Bump:
    """Never frees: the simplest heap policy there is (for tests only)."""

    name: ClassVar[str] = "toy-bump"
    description: ClassVar[str] = "Bump allocator: every request at the end of the previous one"
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.HEAP, rank=50)

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        inp = prepare(trace)
        n = len(inp)
        alloc = inp.kind == Kind.ALLOC
        rounded = np.where(alloc, np.maximum(round_up(inp.size), 512), 0)
        end = np.cumsum(rounded)
        cap = config.capacity if config.capacity is not None else 1 << 60
        ok = end <= cap
        first_bad = int(np.argmin(ok)) if not ok.all() else n
        status = np.where(alloc, Status.DONE, np.where(inp.kind == Kind.FREE, Status.DONE, Status.IGNORED))
        status = status.astype(np.int8)
        status[first_bad:] = Status.IGNORED
        stats = heap_stats()
        if first_bad < n:
            status[first_bad] = Status.OOM
            stats[Stat.OOMS] = 1
            stats[Stat.FIRST_OOM] = first_bad
            stats[Stat.OOM_ROUNDED] = rounded[first_bad]
            stats[Stat.OOM_RESERVED] = cap
        live_end = end[first_bad - 1] if first_bad > 0 else 0
        stats[Stat.PEAK_LIVE] = stats[Stat.PEAK_EXTENT] = live_end
        addr = np.where(alloc, end - rounded, 0).astype(np.uint64)
        return heap_run(config, addr, status, rounded, stats)


@pytest.fixture
def toy() -> Iterator[str]:
    policies.register(Bump())
    try:
        yield Bump.name
    finally:
        policies.unregister(Bump.name)


@pytest.fixture
def three(tmp_path: Path) -> Path:
    op = np.array([Op.MALLOC] * 3, np.int8)
    size = np.array([1000, 512, 1], np.uint64)
    addr = np.array([1, 2, 3], np.uint64) * 4096
    path = tmp_path / "three.parquet"
    write_trace(path, TraceMeta.new(Source.SYNTHETIC), Events.build(op, size, addr=addr))
    return path


def test_registered_policy_replays_through_the_cli(toy: str, three: Path) -> None:
    r = runner.invoke(app, ["replay", str(three), "--sim", toy, "--json"])
    assert r.exit_code == 0, r.output
    assert '"peak_extent": 2048' in r.stdout and '"oom": null' in r.stdout
    r = runner.invoke(app, ["replay", str(three), "--sim", toy, "--capacity", "1536"])
    assert r.exit_code == 0, r.output
    assert "out of memory  at seq 2" in r.stdout


def test_registered_policy_is_in_the_help_by_its_layout(toy: str) -> None:
    r = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "400"})
    assert r.exit_code == 0
    heaps = r.stdout.split("(one heap")[0]
    assert toy in heaps and "cupy" not in heaps


def test_whatif_searches_every_policy_that_takes_part(toy: str, three: Path) -> None:
    res = whatif(read_trace(three), jobs=1)
    assert [f.policy for f in res.fits] == policies.whatif_defaults()
    fit = next(f for f in res.fits if f.policy == toy)
    assert fit.min_capacity == 2 << 20


def test_traits_drive_defaults() -> None:
    assert policies.listed()[:5] == ["best-fit", "first-fit", "next-fit", "worst-fit", "buddy"]
    assert policies.of_layout(Layout.POOL) == ["cupy", "torch", "cuda", "cupy-async", "rmm-pool"]
    assert policies.whatif_defaults() == [*policies.of_layout(Layout.HEAP), "cupy", "torch"]  # named only
    assert all(policies.traits(p).recorded_limit for p in ("cupy", "torch"))  # type: ignore[union-attr]
    assert policies.traits("torch").reproduces == Source.TORCH  # type: ignore[union-attr]
    assert policies.for_source(Source.CUPY) == "cupy" and policies.for_source(Source.SYNTHETIC) is None
    assert policies.is_heap("buddy") and not policies.is_heap("cupy") and not policies.is_heap("nope")
    with pytest.raises(ValueError):
        policies.register(policies.get("cupy"))


def test_unknown_policy_lists_the_registered_ones(toy: str, three: Path) -> None:
    r = runner.invoke(app, ["replay", str(three), "--sim", "nope"])
    assert r.exit_code == 2 and toy in r.output


def test_each_real_allocator_policy_names_the_allocator_it_models() -> None:
    # The registry, not a name, says which policy models CuPy's pool and PyTorch's allocator.
    assert policies.modelling(Allocator.CUPY) == "cupy"
    assert policies.modelling(Allocator.TORCH) == "torch"
    assert policies.allocator_of("torch") == Allocator.TORCH
    assert policies.allocator_of("best-fit") is None  # a model of an idea
    assert policies.allocator_of("no-such-policy") is None
    for name in policies.names():  # a policy reproducing a recording's source models a real allocator
        t = policies.traits(name)
        assert t is not None and (t.reproduces is None or t.models is not None), name


class ModelledBump(Bump):
    """The toy again, claiming to model CuPy's pool (for the registry's lookup only)."""

    name: ClassVar[str] = "toy-modelled"
    traits: ClassVar[PolicyTraits] = PolicyTraits(Layout.HEAP, rank=99, models=Allocator.CUPY)


def test_a_registered_policy_can_model_a_real_allocator() -> None:
    policies.register(ModelledBump())
    try:
        assert policies.allocator_of("toy-modelled") == Allocator.CUPY
        assert policies.modelling(Allocator.CUPY) == "cupy"  # the first in listing order (cupy's rank: 5)
    finally:
        policies.unregister("toy-modelled")


def test_every_real_allocator_has_its_policy() -> None:
    # What replay --device --allocator runs, replay --sim can model, and by the same name.
    assert {a: policies.modelling(a) for a in Allocator} == {a: a.value for a in Allocator}
