"""When the device ran out (no pool limit was hit): the room the process had, and the cures.

A pool limit is a setting; the device is not. When the reported OOM of a device is an
``overhead`` or ``exhaustion`` verdict with the device's free memory measured at the OOM
(a format-v2 recording) and no pool limit was binding, the run can only have used

    room R = free at the OOM (cudaMemGetInfo, measured) + reserved by the recorded pools
             at the OOM (their live segments in the trace, bytes)

so ``advise`` checks every setting under R instead of the device total, and offers one
cure per term of the device budget (``tracekit.analysis.oom_budget``) that the user
controls, each giving back ``b`` bytes (said how they were had):

- **stack limit** (local memory), when it grew from s0 to s1 per thread:
  b = (s1 − s0) × threads, threads = SMs × max resident threads per SM (estimated); when
  the device free measured at the recorded rows fell by that amount (within 5 %) across
  one interval, b is that measured fall. On the H200 lowering the limit after the kernel
  gave back exactly (16,384 − 1,024) B × 270,336 threads = 4,152,360,960 B.
- **malloc heap** and **printf FIFO**, when grown from h0 to h1: b = h1 − h0 (estimated:
  the limit, not a usage). The cure is the limit set before the first kernel that uses
  it: on the H200 lowering the heap after a ``malloc`` kernel ran is refused
  (``cudaErrorInvalidValue``).
- **module loading** (PyTorch): when this process's memory outside the pool and the
  three limits exceeds 1 GiB, b = that − 564,985,856 B (PyTorch's context with
  ``CUDA_MODULE_LOADING=LAZY`` on the H200; 1,890,385,920 B with ``EAGER``) (estimated).
- **another process**: b = its NVML used bytes at the OOM (measured).
- **another pool of this process**: b = its free cached bytes (reserved − live at the
  OOM, from the trace's rows; derived), given back by its ``free_all_blocks()``; and
  memory this process took outside every recorded pool since start (another framework's
  cache, libraries' workspaces): b = the growth of the budget's "rest" term (derived).

A term that gives back under 1 MiB is not offered. A stack limit that grew where the
recording has no start budget (``record --torch``: no SM or thread count) cannot be sized
and is said as a note with the formula instead.

A set of cures S fits when the recorded setting, replayed with capacity R + Σ_{c∈S} b_c
(never above the raising pool's own limit), serves every request through the failing one.
The recommendation is the smallest such set (fewest cures; then fewer other processes,
fewer terms whose holder is not named, fewer estimated figures, more bytes), found from N,
the smallest capacity under the recorded setting (bisection, 2 MiB steps): S suffices when
Σ b ≥ N − R, and the pick is then replayed. When even every cure falls short, what is
missing is N − R − Σ b (bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import TypedDict

import numpy as np

from tracekit.advise.candidates import Candidate, Cure, Kind, cupy_pool, torch
from tracekit.analysis.diagnosis import Diagnosis
from tracekit.analysis.oom_budget import FreeSource, How, Moment, OOMBudget, moment_drop
from tracekit.analysis.recording import ProcessUse, extra_column
from tracekit.analysis.summary import OOMReport
from tracekit.sim.base import Allocator
from tracekit.trace.outcome import held_limit
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.units import format_size as fs

KiB, MiB = 1 << 10, 1 << 20
MATCH = 0.05  # a measured fall within 5 % of the model is taken as the cure's measured bytes
LAZY_CONTEXT = 564_985_856  # PyTorch's context with CUDA_MODULE_LOADING=LAZY, H200 (measured)
EAGER_MIN = 1 << 30  # a rest above this in a PyTorch process suggests eager module loading
SMALLEST = MiB  # a term that gives back less is not worth a cure
MAX_SET = 8  # cures considered for sets (the largest ones)
CUDA_PYTHON = ("; with cuda-python instead: from cuda.bindings import runtime; "
               "runtime.cudaDeviceSetLimit(runtime.cudaLimit.cudaLimitStackSize, {})")
LIMIT_CODES = {"stack": (0, "cudaLimitStackSize"), "printf": (1, "cudaLimitPrintfFifoSize"),
               "heap": (2, "cudaLimitMallocHeapSize")}  # cudaLimit == CUlimit values


class RoomDict(TypedDict):
    """``room`` in ``advise --json``."""

    device: int
    seq: int
    free_bytes: int
    reserved_bytes: int
    reserved_how: str
    room_bytes: int
    need_bytes: int | None
    missing_bytes: int | None


@dataclass(frozen=True)
class Room:
    """What the process had on one device when it ran out (bytes).

    ``need``: the smallest capacity under the recorded setting (None until searched).
    """

    device: int
    seq: int
    request: int
    free: int
    reserved: int
    reserved_how: How
    need: int | None = None
    limit: int | None = None  # the raising pool's limit, where it has one above the room

    @property
    def bytes(self) -> int:
        return self.free + self.reserved

    def capacity(self, returned: int) -> int:
        """The capacity with ``returned`` bytes more room: R + returned, never above the pool's limit."""
        cap = self.bytes + returned
        return min(cap, self.limit) if self.limit is not None else cap

    @property
    def missing(self) -> int | None:
        return None if self.need is None else max(0, self.need - self.bytes)

    def to_dict(self) -> RoomDict:
        return {"device": self.device, "seq": self.seq, "free_bytes": self.free,
                "reserved_bytes": self.reserved, "reserved_how": self.reserved_how.value,
                "room_bytes": self.bytes, "need_bytes": self.need, "missing_bytes": self.missing}

    def sentence(self) -> str:
        return (f"the process had {fs(self.bytes)} on device {self.device} at the OOM ({fs(self.free)} free, "
                f"measured, + {fs(self.reserved)} in its pools)")


def room_at(report: OOMReport | None, pool_limit: int | None) -> Room | None:
    """The room when the device ran out at ``report`` (see the module docstring), else None.

    ``pool_limit``: the limit of the pool that raised, if any; a limit the request went
    over is the binding constraint, and the existing pool settings answer it.
    """
    if report is None or report.budget is None or report.diagnosis not in (Diagnosis.OVERHEAD,
                                                                            Diagnosis.EXHAUSTION):
        return None
    b = report.budget
    if b.free_source is not FreeSource.MEASURED or b.free is None:
        return None
    if pool_limit is not None and report.reserved_bytes + report.rounded > pool_limit:
        return None
    pool = b.term("pool reserved")
    how = How.MEASURED if pool is not None and pool.oom == report.reserved_bytes and \
        pool.how_oom is How.MEASURED else How.DERIVED
    return Room(report.device, report.seq, report.rounded, b.free, report.reserved_bytes, how,
                limit=pool_limit)


def failing_pool_limit(trace: Trace, report: OOMReport) -> int | None:
    """The limit of the pool that raised: measured at the OOM, else the one the device was held to
    (``held_limit``)."""
    m = report.budget.moment if report.budget is not None else None
    if m is not None and m.state is not None and m.state.pool_limit is not None:
        return m.state.pool_limit
    return held_limit(trace.events, trace.meta, report.device)


def cures(trace: Trace, kind: str, report: OOMReport) -> tuple[Cure, ...]:
    """Every cure the budget at ``report`` shows, largest first (see the module docstring)."""
    b = report.budget
    if b is None or b.moment is None:
        return ()
    m = b.moment
    found = [*_limit_cures(m, kind), *_module_loading(b, kind), *_processes(m),
             *_other_pools(trace, report), *_unrecorded(b)]
    return tuple(sorted((c for c in found if c.returns >= SMALLEST), key=lambda c: -c.returns))


CUDA_DEFAULT_STACK = 1024  # cudaLimitStackSize before any kernel needs more (bytes per thread)


def unsized(report: OOMReport) -> tuple[str, ...]:
    """A grown stack limit the recording could not size (no start budget: SM and thread counts,
    the limit at start), said as a note with the formula instead of a cure."""
    b = report.budget
    m = b.moment if b is not None else None
    if m is None or m.state is None or (m.start is not None and m.start.threads):
        return ()
    s1 = m.state.limits.stack_size
    if s1 is None or s1 <= CUDA_DEFAULT_STACK:
        return ()
    return (f"the stack limit is {_size(s1)} per thread at the OOM (CUDA's default: 1 KiB); the recording "
            "did not measure the device's thread count, so what lowering it after the kernel gives back is "
            f"unknown here: ({s1:,} - 1,024) B x SMs x max threads per SM",)


def _size(n: int) -> str:
    return f"{n // KiB} KiB" if n % KiB == 0 and n >= KiB else f"{n:,} B"


def _set_line(kind: str, which: str, value: int) -> str:
    """The exact line that sets a cudaLimit in this program's framework."""
    code, name = LIMIT_CODES[which]
    if kind == Allocator.TORCH:  # PyTorch has no binding: the driver's call on the current (primary) context
        return f"import ctypes; ctypes.CDLL('libcuda.so.1').cuCtxSetLimit({code}, ctypes.c_size_t({value}))" \
               f"  # {name}"
    return f"cupy.cuda.runtime.deviceSetLimit(cupy.cuda.runtime.{name}, {value})"


def _limit_cures(m: Moment, kind: str) -> list[Cure]:
    st, s = m.start, m.state
    if st is None or s is None:
        return []
    out = []
    threads = st.threads
    s0, s1 = st.limits.stack_size, s.limits.stack_size
    if s0 is not None and s1 is not None and s1 > s0 and threads:
        out.append(_stack(m, kind, s0, s1, threads, st.threads_per_sm or 0, st.sm_count or 0))
    grown = (("heap", "device malloc heap", st.limits.malloc_heap_size, s.limits.malloc_heap_size),
             ("printf", "printf FIFO", st.limits.printf_fifo_size, s.limits.printf_fifo_size))
    for which, label, a, b in grown:
        if a is None or b is None or b <= a:
            continue
        later = ("once such a kernel has run, the limit cannot be lowered: the H200 answers "
                 "cudaErrorInvalidValue" if which == "heap" else "lowering it later was not measured")
        out.append(Cure(
            Kind.MALLOC_HEAP if which == "heap" else Kind.PRINTF_FIFO,
            f"keep the {label} limit at {fs(a)} (the program raised it to {fs(b)})",
            b - a, How.ESTIMATED, f"the limit's growth, {b:,} - {a:,} B (a limit, not a usage)",
            _set_line(kind, which, a),
            f"before the first kernel that calls {'malloc' if which == 'heap' else 'printf'}, where the "
            f"program raises it now ({later})"))
    return out


def _stack(m: Moment, kind: str, s0: int, s1: int, threads: int, per_sm: int, sms: int) -> Cure:
    model = (s1 - s0) * threads
    formula = f"({s1:,} - {s0:,}) B x {threads:,} threads ({sms} SMs x {per_sm:,})"
    drop = moment_drop(m, model)
    if drop is not None and abs(drop.bytes - model) <= MATCH * model:
        after = "the start" if drop.after < 0 else f"seq {drop.after}"
        how, returns = How.MEASURED, drop.bytes
        why = f"device free fell by {drop.bytes:,} B beyond the pool's growth between {after} and seq " \
              f"{drop.before}; the model {formula} = {model:,} B"
    else:
        how, returns, why = How.ESTIMATED, model, formula
    return Cure(
        Kind.STACK_LIMIT, f"lower the stack limit from {_size(s1)} to {_size(s0)} per thread", returns, how,
        why, _set_line(kind, "stack", s0),
        "after the kernel that raised it has returned (synchronize first; its next launch raises it again)",
        f"give that kernel less local memory per thread: each 1 KiB less gives back {fs(threads * KiB)}"
        + (CUDA_PYTHON.format(s0) if kind == Allocator.TORCH else ""))


def _module_loading(b: OOMBudget, kind: str) -> list[Cure]:
    if kind != Allocator.TORCH:
        return []
    rest = b.term("code, constants, driver (rest)")
    outside = b.term("this process outside the pool")
    held = rest.oom if rest is not None and rest.oom is not None else (outside.oom if outside else None)
    if held is None or held < EAGER_MIN:
        return []
    return [Cure(Kind.MODULE_LOADING, "load CUDA modules lazily", held - LAZY_CONTEXT, How.ESTIMATED,
                 f"this process outside its pool, {held:,} B, less PyTorch's lazy-loading context on the "
                 f"H200 ({LAZY_CONTEXT:,} B; eager: 1,890,385,920 B)",
                 "export CUDA_MODULE_LOADING=LAZY", "in the environment before the process starts")]


def _processes(m: Moment) -> list[Cure]:
    s = m.state
    if s is None:
        return []
    return [_process(p, m.seq) for p in s.others]


def _process(p: ProcessUse, seq: int) -> Cure:
    return Cure(Kind.OTHER_PROCESS, f"stop {p.label()}", p.used, How.MEASURED,
                f"NVML used bytes of process {p.pid} at the OOM (seq {seq})",
                f"stop {p.label()}, or move this run to another device with CUDA_VISIBLE_DEVICES",
                "before this run reaches the failing request", own=False)


def pool_holdings(trace: Trace, k: int) -> dict[int, tuple[int, int]]:
    """Per recorded pool id: (reserved, live) bytes right before row k (segments and blocks alive)."""
    pools = extra_column(trace, "pool")
    if pools is None:
        return {}
    ev, mate = trace.events, trace.mate
    idx = np.arange(len(ev))
    alive = (idx < k) & ((mate < 0) | (mate >= k)) & (pools >= 0)
    seg = alive & (ev.op == Op.SEGMENT_ALLOC)
    blk = alive & (ev.op == Op.MALLOC)
    n = int(pools.max()) + 1 if len(pools) and pools.max() >= 0 else 0
    res = np.bincount(pools[seg], weights=ev.size[seg].astype(np.float64), minlength=n)
    live = np.bincount(pools[blk], weights=ev.rounded[blk].astype(np.float64), minlength=n)
    return {p: (int(res[p]), int(live[p])) for p in range(n) if res[p] > 0}


def _other_pools(trace: Trace, report: OOMReport) -> list[Cure]:
    pools = extra_column(trace, "pool")
    ks = np.flatnonzero(trace.events.seq == report.seq)
    if pools is None or len(ks) == 0:
        return []
    k = int(ks[0])
    failing = int(pools[k])
    out = []
    for pid, (reserved, live) in pool_holdings(trace, k).items():
        if pid == failing or reserved <= live:
            continue
        out.append(Cure(
            Kind.OTHER_POOL, f"free the cached blocks of pool {pid}", reserved - live, How.DERIVED,
            f"pool {pid}'s segments ({reserved:,} B) less its live blocks ({live:,} B) in the trace at seq "
            f"{report.seq}", f"free_all_blocks() on pool {pid} (cupy.get_default_memory_pool() for the "
                             "default pool)", "before the failing request"))
    return out


def _unrecorded(b: OOMBudget) -> list[Cure]:
    rest = b.term("code, constants, driver (rest)")
    if rest is None or rest.change is None or rest.change < 64 * MiB:
        return []
    return [Cure(
        Kind.OTHER_POOL, "release what this process took outside its recorded pools", rest.change,
        How.DERIVED,
        f"the budget's rest (code, constants, driver) grew from {rest.start:,} to {rest.oom:,} B since "
        "start; what holds it is not recorded (another framework's cache, a library's workspace, "
        "loaded modules)",
        "release the other allocator's cache before the failing request: torch.cuda.empty_cache() "
        "(PyTorch) or cupy.get_default_memory_pool().free_all_blocks() (CuPy)",
        "before the failing request", named=False)]


def recorded(kind: str) -> Candidate:
    """The setting the run was recorded with (PyTorch: the recorded allocator settings)."""
    return torch({}) if kind == Allocator.TORCH else cupy_pool()


def as_candidate(base: Candidate, chosen: Sequence[Cure]) -> Candidate:
    """The recorded setting with ``chosen`` applied (a cure's own kind, or ``CURES`` for several)."""
    kind = chosen[0].kind if len(chosen) == 1 else Kind.CURES
    return Candidate(kind, base.policy, base.options, cures=tuple(chosen))


def preference(chosen: Sequence[Cure]) -> tuple[int, int, int, int, int]:
    """Smaller is better: fewer cures, fewer other processes, fewer bytes whose holder is not named,
    fewer estimated figures, more bytes."""
    return (len(chosen), sum(not c.own for c in chosen), sum(not c.named for c in chosen),
            sum(c.how is How.ESTIMATED for c in chosen), -sum(c.returns for c in chosen))


def smallest_set(found: Sequence[Cure], deficit: int) -> tuple[Cure, ...] | None:
    """The preferred set of fewest cures whose bytes cover ``deficit``; () when nothing is missing,
    None when even all of them fall short."""
    if deficit <= 0:
        return ()
    pool = sorted(found, key=lambda c: -c.returns)[:MAX_SET]
    for k in range(1, len(pool) + 1):
        sets = [s for s in combinations(pool, k) if sum(c.returns for c in s) >= deficit]
        if sets:  # this process's own terms first, as the user would apply them
            best = min(sets, key=preference)
            return tuple(sorted(best, key=lambda c: (not c.own, not c.named, -c.returns)))
    return None
