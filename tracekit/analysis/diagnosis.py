"""Why a request ran out of memory: the first of four causes that holds, in one sentence.

With R = the rounded request, N = the device memory the allocator must add to
serve it (R, or PyTorch's segment size: 2 MiB for R ≤ 1 MiB, 20 MiB below
10 MiB, else R rounded up to 2 MiB), L = live bytes, S = reserved bytes,
F = S − L (free inside the pool), G = the largest free block the request could
use, P = the limit of the pool that raised, S_p = that pool's reserved bytes
(measured at the OOM, else S), T = the device total, O = the overhead at start
and D = device free (cudaMemGetInfo at the OOM where measured, else derived as
T − O − S), all at the failing event, on the failing request's device:

1. ``fragmentation``: F ≥ R and G < R: the pool held enough free bytes, but
   no single piece was big enough.
2. ``limit``: S_p + N > P while the device still had room (D ≥ N, or D
   unknown): the pool's or process's limit was the binding constraint.
3. ``overhead``: S + N ≤ T but S + N > T − O (or D < N): the request would
   have fit in the device's total, but memory held outside the allocator
   (driver, CUDA context, other processes, reservations) took the room. With
   D measured, the sentence names the takers from the budget at the OOM
   (``tracekit.analysis.oom_budget``).
4. ``exhaustion``: otherwise: live bytes plus the request exceed what exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from tracekit.analysis.context import DeviceContext
from tracekit.units import format_size as fs


class Diagnosis(StrEnum):
    FRAGMENTATION = "fragmentation"
    LIMIT = "limit"
    OVERHEAD = "overhead"
    EXHAUSTION = "exhaustion"


@dataclass(frozen=True)
class OOMFacts:
    """The numbers at the failing event (bytes; None = unknown)."""

    request: int
    segment: int  # device memory needed to serve the request (N)
    live: int
    reserved: int
    largest_free: int
    usable_largest_free: int
    device_free: int | None
    raw_device: bool
    device: int = 0
    free_measured: bool = False  # device_free was measured at the OOM (else derived from the start)
    takers: str = ""  # what took the device's memory, from the budget at the OOM (may be empty)
    pool_reserved: int | None = None  # the failing pool's own reserved bytes (measured, else its rows)
    own_pool: str = ""  # the failing pool where the program made it ("the program's own pool 'user 1' ...")

    @property
    def free_in_pool(self) -> int:
        return self.reserved - self.live


def diagnose(f: OOMFacts, ctx: DeviceContext) -> tuple[Diagnosis, str]:
    """The first cause that holds (see the module docstring) and its explanation; where live
    bytes exceed reserved bytes the explanation says the trace contradicts itself."""
    d, why = _diagnose(f, ctx)
    if f.free_in_pool < 0 and not f.raw_device:
        why += (f" Caution: live blocks ({fs(f.live)}) exceed the reserved segments ({fs(f.reserved)}) here:"
                " the trace's blocks and segments contradict each other, so this diagnosis is unreliable.")
    return d, why


def _diagnose(f: OOMFacts, ctx: DeviceContext) -> tuple[Diagnosis, str]:
    r, s, free, n = f.request, f.reserved, f.free_in_pool, f.segment
    g = min(f.largest_free, f.usable_largest_free)
    held = "the heap" if ctx.heap_capacity is not None else "the pool"
    if free >= r > g:
        where = ""
        if f.largest_free >= r:
            where = f" usable by it (a larger one, {fs(f.largest_free)}, served another stream or pool)"
        return Diagnosis.FRAGMENTATION, (
            f"The request for {fs(r)} on device {f.device} failed although {held} held {fs(free)} free: "
            "that space was "
            f"split into pieces and the largest free block{where} was only {fs(g)}, so no single "
            "piece could hold it."
        )
    d = f.device_free
    # Several pools may share a device; a limit is the raising pool's, so it counts that pool's bytes.
    sp = f.pool_reserved if f.pool_reserved is not None else s
    if ctx.limit is not None and sp + n > ctx.limit and (d is None or d >= n):
        room = (f"while the device still had {fs(d)} free" if d is not None
                else "(how much the device had left is not recorded)")
        seg = f" (a new {fs(n)} segment)" if n != r else ""
        return Diagnosis.LIMIT, (
            f"The request for {fs(r)}{seg} on device {f.device} would have taken {f.own_pool or held} to "
            f"{fs(sp + n)}, over its {ctx.limit_what} of {fs(ctx.limit)}, {room}: the limit ran out, "
            "not the device."
        )
    t, o = ctx.device_total, ctx.overhead
    if t is not None and s + n <= t and f.free_measured and d is not None and d < n:
        return Diagnosis.OVERHEAD, _measured_sentence(f, t)
    if t is not None and s + n <= t and (o is not None or d is not None):
        return Diagnosis.OVERHEAD, _overhead_sentence(f, ctx, t, o)
    return Diagnosis.EXHAUSTION, _exhaustion_sentence(f, ctx)


def _measured_sentence(f: OOMFacts, t: int) -> str:
    """Overhead with the device's free memory measured at the OOM: name the takers."""
    r, s = f.request, f.reserved
    assert f.device_free is not None
    held = "live blocks" if f.raw_device else "the allocator"
    head = (f"The request for {fs(r)} on device {f.device} failed with only {fs(f.device_free)} free on "
            f"the device (measured) while {held} held {fs(s)}; {fs(s + f.segment)} would fit in the "
            f"device's {fs(t)}, so memory outside the allocator took the room")
    return f"{head}: {f.takers}." if f.takers else head + "."


def _overhead_sentence(f: OOMFacts, ctx: DeviceContext, t: int, o: int | None) -> str:
    r, s, n = f.request, f.reserved, f.segment
    held = "live blocks" if f.raw_device else "the allocator"
    on = f" on device {f.device}"
    if o is not None and s + n > t - o:
        parts = ctx.overhead_parts()
        biggest = f" (largest part: {parts[0][0]}, {fs(parts[0][1])})" if parts else ""
        return (
            f"The request for {fs(r)}{on} with {fs(s)} held by {held} needed {fs(s + n)}, which fits in "
            f"the device's {fs(t)}, but {fs(o)} was taken before the first allocation by the "
            f"driver, the CUDA context and other reservations{biggest}, leaving only {fs(t - o)}."
        )
    return (
        f"The request for {fs(r)}{on} with {fs(s)} held by {held} needed {fs(s + n)}, which fits in the "
        f"device's {fs(t)}, so memory outside the allocator (another process, a kernel's local "
        "memory or a context created after recording began) must have taken the room."
    )


def _exhaustion_sentence(f: OOMFacts, ctx: DeviceContext) -> str:
    r, live = f.request, f.live
    head = f"The request for {fs(r)} on device {f.device} with {fs(live)} already live needed {fs(live + r)}"
    if ctx.heap_capacity is not None:
        cap, what = ctx.heap_capacity, "heap of"
    elif ctx.limit is not None:
        cap, what = ctx.limit, f"{ctx.limit_what} of"
    elif ctx.device_total is not None:
        cap, what = ctx.device_total, "device total of"
    else:
        return (
            f"{head} and the allocator could not get more than the {fs(f.reserved)} it held; the "
            "device's size is not recorded, so it was presumably full."
        )
    if live + r > cap:
        return (
            f"{head}, more than the {what} {fs(cap)}: memory was simply exhausted."
        )
    return (
        f"{head} of the {what} {fs(cap)}, but with {fs(f.reserved)} already held the allocator could get "
        "no more: memory was exhausted."
    )
