"""Emulating a smaller GPU on a real one: how much to take first, and giving it back on every way out.

``plan_capacity`` is plain arithmetic on the free/total figures: with
``cuda`` and ``cupy-async`` a capacity C is emulated by taking a *ballast* of
``free - C - DRIVER_SLACK`` bytes in one ``cudaMalloc`` before the replay,
rounded down to the 2 MiB device granularity, so C + 4 MiB to C + 6 MiB stay
free and C bytes can really be allocated (the driver keeps ~3.5 MiB back);
with ``cupy`` C is the pool's limit (``set_limit``) and nothing is taken. A
capacity above the free memory is refused before anything is allocated.
``Ballast`` holds that one allocation and releases it on normal exit, on an
exception, on Ctrl-C and on SIGTERM (``deferred_signals`` holds either signal
until the replay loop reaches a safe point, then raises, so every ``finally``
runs with complete bookkeeping). Managed memory is never used.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypedDict

from tracekit import interrupts
from tracekit.errors import DeviceError, UsageError
from tracekit.interrupts import Held
from tracekit.sim.allocators import Allocator  # the real allocators, described once beside the policies
from tracekit.units import format_size

GRANULARITY = 2 << 20  # bytes; cudaMalloc maps device memory in 2 MiB pages above 1 MiB
# The driver never hands out its last few MiB: on an H200 the largest single cudaMalloc is
# 3.2-3.5 MiB below cudaMemGetInfo's free figure. The ballast leaves this much on top of the
# capacity so that an allocation of exactly the capacity still succeeds.
DRIVER_SLACK = 4 << 20


def parse_allocator(text: str) -> Allocator:
    """The real allocator ``--allocator`` names; UsageError listing the names otherwise."""
    try:
        return Allocator(text)
    except ValueError:
        names = ", ".join(a.value for a in Allocator)
        raise UsageError(f"unknown --allocator {text!r} (expected one of {names})") from None


class CapacityPlanDict(TypedDict):
    capacity: int | None
    ballast_bytes: int
    pool_limit: int | None


@dataclass(frozen=True)
class CapacityPlan:
    """What to do before replaying: ``ballast_bytes`` to take, ``pool_limit`` for CuPy's pool.

    ``capacity`` is what was asked (None = the whole free memory).
    """

    capacity: int | None
    ballast_bytes: int
    pool_limit: int | None

    def to_dict(self) -> CapacityPlanDict:
        return CapacityPlanDict(capacity=self.capacity, ballast_bytes=self.ballast_bytes,
                                pool_limit=self.pool_limit)


def plan_capacity(allocator: Allocator, capacity: int | None, free: int, total: int) -> CapacityPlan:
    """Decide the ballast / pool limit for ``capacity`` given cudaMemGetInfo ``free`` and ``total``.

    Raises UsageError for a capacity of 0 or above ``free`` (the device cannot
    emulate a GPU larger than what is free on it).
    """
    if capacity is None:
        return CapacityPlan(None, 0, None)
    if capacity <= 0:
        raise UsageError(f"--capacity must be positive, got {capacity} bytes")
    if capacity > free:
        raise UsageError(
            f"--capacity {format_size(capacity)} is more than the device's free memory "
            f"({format_size(free)} of {format_size(total)}); nothing was allocated"
        )
    if allocator in (Allocator.CUPY, Allocator.TORCH, Allocator.RMM_POOL):  # a pool limit: nothing to take
        return CapacityPlan(capacity, 0, capacity)
    ballast = max(0, (free - capacity - DRIVER_SLACK) // GRANULARITY * GRANULARITY)
    return CapacityPlan(capacity, ballast, None)


class Ballast:
    """One cudaMalloc of ``nbytes`` held for the replay; ``release()`` is idempotent."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.ptr = 0
        if nbytes <= 0:
            return
        from cupy.cuda import runtime

        try:
            self.ptr = int(runtime.malloc(nbytes))
        except runtime.CUDARuntimeError as e:
            raise DeviceError(
                f"could not take {format_size(nbytes)} to emulate the capacity ({e}); "
                "the free memory changed while planning"
            ) from None

    def release(self) -> None:
        if self.ptr:
            from cupy.cuda import runtime

            ptr, self.ptr = self.ptr, 0
            runtime.free(ptr)

    def __enter__(self) -> Ballast:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def deferred_signals() -> AbstractContextManager[Held]:
    """Within the block SIGINT/SIGTERM are only held (``tracekit.interrupts.deferred``); the loop
    raises them at ``check()`` (every few hundred requests, where no pointer is in flight) or, at
    the latest, when the block ends, after its ``finally`` clauses released the device: one
    ``Interrupted``, exit 130 for SIGINT and 143 for SIGTERM, as for every verb."""
    return interrupts.deferred()
