"""Compiled replay loop of the device-allocator models (``cuda``, ``cupy-async``).

Per request of s bytes, r = ⌈s / 512⌉ · 512 is what the program holds (live bytes). What the
device gives for it, and when a request fails, depends on the model (``DeviceSetting.POOLED``):

- **cudaMalloc** (``POOLED`` 0): each block is its own device allocation of
  cost(s) = r if s ≤ 1 MiB, else ⌈s / 2 MiB⌉ · 2 MiB; used = Σ_live cost; a request fails when
  used + cost(s) > bound. Reserved bytes = used (a free gives its allocation back at once).
- **MemoryAsyncPool** (``POOLED`` 1): the driver's pool maps 2 MiB pages for the live bytes as a
  whole; a request fails when ⌈(live + r) / 2 MiB⌉ · 2 MiB > bound. With CuPy's release threshold
  (UINT64_MAX) the pool never gives memory back, so reserved bytes = the most pages it ever held:
  max over time of ⌈live / 2 MiB⌉ · 2 MiB.

``bound`` is the device memory the allocator may take (``BOUND``; 0 = unbounded). A request of
0 bytes gets a null pointer and costs nothing (CuPy returns one without a device call). Addresses
are invented from ``ADDR_BASE`` up and never reused: small blocks 512-byte aligned, blocks above
1 MiB on 2 MiB boundaries (as measured on the H200), the async pool's blocks 512-byte aligned.
Handled attempts (``Kind.TRY``) follow the contract every kernel keeps (``prepare.stand_in``).
The loop runs in chunks over a state vector (``DeviceSlot``), so a replay reports progress.
"""

from __future__ import annotations

from enum import IntEnum

from tracekit.compiled import plain
from tracekit.sim import limit_test
from tracekit.sim.chunks import ADDR_BASE, MIB, PAGE
from tracekit.sim.codes import Kind, Stat, Status
from tracekit.sim.prepare import SIZE_CLAMP, stand_in
from tracekit.trace.live import UNIT


class DeviceSetting(IntEnum):
    """The kernel's settings vector."""

    BOUND = 0  # device bytes the allocator may take; 0 = unbounded
    POOLED = 1  # 1: the async pool (pages of the live total, kept); 0: one cudaMalloc per block
    CONTINUE = 2  # 1: a failed request is skipped (with its free) and the replay goes on


class DeviceSlot(IntEnum):
    """The kernel's state vector (int64), carried from chunk to chunk."""

    LIVE = 0  # Σ r over live blocks
    USED = 1  # Σ cost over live blocks (cudaMalloc's device bytes)
    RESERVED = 2  # what the allocator holds now
    NEXT_ADDR = 3  # where the next invented address starts
    STOPPED = 4  # 1 once a failed request ended the replay
    ASKED = 5  # the most device bytes a request's bound test asked for (``Stat.ASKED``)
    PASSED = 6  # the most of those the test let through (``Stat.SAME_FROM``)
    REFUSED = 7  # the least of those it refused, 0 while none was (``Stat.SAME_BELOW``)


def new_state() -> list[int]:
    """The state before the first event, in ``DeviceSlot`` order."""
    return [0, 0, 0, ADDR_BASE, 0, 0, 0, 0]


@plain(error_model="numpy")
def pages(x):  # pragma: no cover - compiled
    """x bytes in whole 2 MiB pages: ⌈x / 2 MiB⌉ · 2 MiB."""
    return (x + PAGE - 1) // PAGE * PAGE


@plain(error_model="numpy")
def block_cost(s, pooled):  # pragma: no cover - compiled
    """Device bytes one block of s requested bytes is charged: r, or cudaMalloc's whole pages above 1 MiB."""
    if pooled or s <= MIB:
        return (s + UNIT - 1) // UNIT * UNIT
    return pages(s)


@plain(error_model="numpy")
def largest_block(free):  # pragma: no cover - compiled
    """The largest request cudaMalloc could serve from ``free`` device bytes (whole pages above 1 MiB)."""
    p = free // PAGE * PAGE
    if p > MIB:
        return p
    return min(free, MIB) // UNIT * UNIT


@plain(error_model="numpy")
def _needed(S, r, c, pooled):  # pragma: no cover - compiled
    """Device bytes the allocator holds once a block (r live bytes, cost c) is added."""
    if pooled:
        return max(S[DeviceSlot.RESERVED], pages(S[DeviceSlot.LIVE] + r))
    return S[DeviceSlot.USED] + c


@plain(inline="always")
def _fits(S, need, bound):  # pragma: no cover - compiled
    """The bound test ``need <= bound`` (bytes; 0: unbounded), where the bound enters a replay."""
    return limit_test.passes(S, need, bound, DeviceSlot.ASKED, DeviceSlot.PASSED, DeviceSlot.REFUSED)


@plain(error_model="numpy")
def _note_oom(S, i, r, bound, pooled, stats):  # pragma: no cover - compiled
    """Count a failed request; the first one also records the allocator's state (free: the pool's
    cached bytes for the async pool, the device's free bytes for cudaMalloc; -1 when unbounded)."""
    stats[Stat.OOMS] += 1
    if stats[Stat.FIRST_OOM] >= 0:
        return
    stats[Stat.FIRST_OOM] = i
    stats[Stat.OOM_LIVE] = S[DeviceSlot.LIVE]
    stats[Stat.OOM_RESERVED] = S[DeviceSlot.RESERVED]
    stats[Stat.OOM_ROUNDED] = r
    if bound <= 0:
        stats[Stat.OOM_FREE] = -1
        stats[Stat.OOM_LARGEST] = -1
    elif pooled:
        stats[Stat.OOM_FREE] = S[DeviceSlot.RESERVED] - S[DeviceSlot.LIVE]
        stats[Stat.OOM_LARGEST] = max(0, bound // PAGE * PAGE - S[DeviceSlot.LIVE])
    else:
        stats[Stat.OOM_FREE] = bound - S[DeviceSlot.USED]
        stats[Stat.OOM_LARGEST] = largest_block(bound - S[DeviceSlot.USED])


@plain(error_model="numpy")
def _place(S, c, pooled):  # pragma: no cover - compiled
    """An invented address for a block of cost c: 2 MiB-aligned above 1 MiB for cudaMalloc, else 512."""
    align = PAGE if (not pooled and c > MIB) else UNIT
    a = (S[DeviceSlot.NEXT_ADDR] + align - 1) // align * align
    S[DeviceSlot.NEXT_ADDR] = a + c
    return a


@plain(error_model="numpy")
def _take(S, r, c, pooled, stats):  # pragma: no cover - compiled
    S[DeviceSlot.LIVE] += r
    S[DeviceSlot.USED] += c
    S[DeviceSlot.RESERVED] = max(S[DeviceSlot.RESERVED], pages(S[DeviceSlot.LIVE])) if pooled \
        else S[DeviceSlot.USED]
    if S[DeviceSlot.RESERVED] > stats[Stat.PEAK_RESERVED]:
        stats[Stat.PEAK_RESERVED] = S[DeviceSlot.RESERVED]


@plain(error_model="numpy")
def _give(S, r, c, pooled):  # pragma: no cover - compiled
    """A block goes back: cudaFree returns its allocation; the async pool keeps its pages."""
    S[DeviceSlot.LIVE] -= r
    S[DeviceSlot.USED] -= c
    if not pooled:
        S[DeviceSlot.RESERVED] = S[DeviceSlot.USED]


@plain(error_model="numpy")
def _free(S, status, rounded, charge, mate, i, pooled):  # pragma: no cover - compiled
    """Row i frees its malloc's block: DONE, or SKIPPED when that malloc was not placed."""
    m = mate[i]
    if m < 0 or status[m] != Status.DONE:
        status[i] = Status.SKIPPED
        return
    status[i] = Status.DONE
    _give(S, rounded[m], charge[m], pooled)


@plain(error_model="numpy")
def _fail(S, status, stats, kd, i, r, bound, pooled, go_on):  # pragma: no cover - compiled
    """Row i cannot be served; True when that ends the replay (a fatal request, no ``CONTINUE``)."""
    status[i] = Status.OOM
    if kd == Kind.TRY:  # the program survived this failure: it goes on
        stats[Stat.HANDLED] += 1
        return False
    _note_oom(S, i, r, bound, pooled, stats)
    return not go_on


@plain(error_model="numpy")
def _serve(S, kd, rep, holder, addr, status, charge, stats, i, r, c, pooled):  # pragma: no cover - compiled
    """Row i gets its block (r live bytes, cost c) at an invented address."""
    addr[i] = _place(S, c, pooled)
    charge[i] = c
    _take(S, r, c, pooled, stats)
    if kd == Kind.TRY and rep[i] < 0:  # served; nothing replaced it: released at once
        _give(S, r, c, pooled)
        status[i] = Status.TRIED
        return
    if kd == Kind.TRY:  # served: it lives in place of the retry that replaced it
        holder[rep[i]] = i
    if S[DeviceSlot.LIVE] > stats[Stat.PEAK_LIVE]:
        stats[Stat.PEAK_LIVE] = S[DeviceSlot.LIVE]
    status[i] = Status.TRIED if kd == Kind.TRY else Status.DONE


@plain(error_model="numpy", nogil=True)  # nogil: advise replays settings in threads
def run_chunk(kind, rep, holder, size, mate, cfg, S, addr, status, rounded, charge, stats,
              lo, hi):  # pragma: no cover - compiled
    """Replay events [lo, hi) (see the module docstring); ``charge`` holds each block's cost."""
    bound = cfg[DeviceSetting.BOUND]
    pooled = cfg[DeviceSetting.POOLED] != 0
    for i in range(lo, hi):
        kd = kind[i]
        if kd == Kind.FREE:
            _free(S, status, rounded, charge, mate, i, pooled)
            continue
        if kd != Kind.ALLOC and kd != Kind.TRY:
            continue
        h = stand_in(kind, rep, holder, i)
        if h >= 0:  # a served handled attempt stands in for this malloc: its block
            addr[i] = addr[h]
            rounded[i] = rounded[h]
            charge[i] = charge[h]
        if h != -1:
            status[i] = Status.DONE if h >= 0 else Status.TRIED
            continue
        s = size[i]
        r = (s + UNIT - 1) // UNIT * UNIT
        rounded[i] = r
        if s == 0:  # a null pointer, no device call
            status[i] = Status.DONE
            continue
        c = block_cost(s, pooled)
        if s < SIZE_CLAMP and _fits(S, _needed(S, r, c, pooled), bound):
            _serve(S, kd, rep, holder, addr, status, charge, stats, i, r, c, pooled)
        elif _fail(S, status, stats, kd, i, r, bound, pooled, cfg[DeviceSetting.CONTINUE] != 0):
            S[DeviceSlot.STOPPED] = 1
            return
