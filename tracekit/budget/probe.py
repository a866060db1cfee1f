"""``--probe-largest``: the largest single cudaMalloc next to the free figure, and the granularity.

Bisection on the request size between 0 and free + 2 MiB, down to 2 MiB steps,
each attempt a cudaMalloc immediately freed (about 17 attempts on a 140 GiB
GPU). Then, for a few request sizes, four allocations are made and the drop
in cudaMemGetInfo free memory is divided by four: the device's own rounding
(small requests share 2 MiB pages; large ones are rounded to 2 MiB on Hopper).
A largest block within a few MiB of the free figure means the device itself
is not fragmented: free memory can be had in one piece.
"""

from __future__ import annotations

from typing import Any

from tracekit.budget.shapes import Granularity, LargestAllocation
from tracekit.errors import DeviceError

MiB = 1 << 20
STEP = 2 * MiB
GRANULARITY_SIZES = (512, 4096, 64 * 1024, MiB, MiB + 1, 2 * MiB + 1, 64 * MiB + 1)


def largest_allocation(device: int) -> LargestAllocation:
    """Bisection for the largest cudaMalloc that succeeds; everything is freed again."""
    import cupy

    rt = cupy.cuda.runtime
    with cupy.cuda.Device(device):
        free = int(rt.memGetInfo()[0])
        lo, hi, tries = 0, free + STEP, 0
        while hi - lo > STEP:
            mid = (lo + hi) // 2
            tries += 1
            try:
                p = rt.malloc(mid)
            except rt.CUDARuntimeError:
                hi = mid
                continue
            rt.free(p)
            lo = mid
        after = int(rt.memGetInfo()[0])
    return LargestAllocation(free=free, largest=lo, gap=free - lo, fraction=lo / free if free else None,
                             attempts=tries, step=STEP, free_after=after)


def granularity(
    device: int, sizes: tuple[int, ...] = GRANULARITY_SIZES, count: int = 4
) -> list[Granularity]:
    """Device bytes per allocation for each request size (free-memory drop over ``count`` allocations)."""
    import cupy

    rt = cupy.cuda.runtime
    rows = []
    with cupy.cuda.Device(device):
        for s in sizes:
            cost, ptrs = measure_cost(rt, s, count)
            rows.append(Granularity(request=s, count=count, cost=cost, per_allocation=cost // count,
                                    alignment=_alignment(ptrs)))
    return rows


def measure_cost(rt: Any, size: int, count: int) -> tuple[int, list[int]]:
    """Free-memory drop over ``count`` cudaMallocs of ``size`` and their pointers (all freed again).

    Whatever was taken is freed also when a later cudaMalloc fails (DeviceError).
    """
    ptrs: list[int] = []
    try:
        before = int(rt.memGetInfo()[0])
        for _ in range(count):
            ptrs.append(int(rt.malloc(size)))
        return before - int(rt.memGetInfo()[0]), list(ptrs)
    except rt.CUDARuntimeError as e:
        raise DeviceError(f"cudaMalloc of {size} bytes failed while measuring granularity ({e})") from None
    finally:
        for p in ptrs:
            rt.free(p)


def _alignment(ptrs: list[int]) -> int:
    """Largest power of two dividing every pointer (capped at 2 MiB)."""
    a = STEP
    while a > 1 and any(p % a for p in ptrs):
        a //= 2
    return a
