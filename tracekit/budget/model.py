"""The budget equation as plain arithmetic: terms, how each was obtained, and the table.

The seed's equation, read left to right on a modern GPU:

    board total = driver/firmware reservation + other processes + this context
                + kernel local-memory reservations + user allocations + free + unaccounted

Every term is bytes. ``budget_terms(b)`` turns a budget dict (the keys of
``tracekit.budget.measure.BUDGET_KEYS`` plus the optional ``kernel_local``,
``probe`` and ``final`` sections of the full budget) into ``Term`` rows; the
context is broken down further into the local-memory model (stack size per
thread x max resident threads per SM x SMs), the device malloc heap, the
printf FIFO and the rest (device code, constant memory, driver bookkeeping),
which are *estimates*: the driver reports the context only as one number.
``unaccounted`` is what is left; on a quiet GPU it is within the 2 MiB
allocation granularity. A term's and a check's JSON (``TermDict``, ``CheckDict``)
are their fields, a check's with the derived ``difference`` and ``ok``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:  # the shapes only: shapes is below nothing here, model below measure
    from tracekit.budget.shapes import Budget

MiB = 1 << 20
GRANULARITY = 2 * MiB  # cudaMalloc rounds requests above 1 MiB to 2 MiB on Hopper


class How:
    MEASURED = "measured"
    ESTIMATED = "estimated"
    DERIVED = "derived"
    UNAVAILABLE = "unavailable"


class TermDict(TypedDict):
    name: str
    bytes: int | None
    how: str
    why: str
    part_of: str | None


class CheckDict(TypedDict):
    name: str
    left: int
    right: int
    difference: int
    tolerance: int
    ok: bool


@dataclass(frozen=True)
class Term:
    """One line of the budget: ``bytes`` (None if unknown), how it was obtained and why.

    ``part_of`` names the term this row breaks down (it is not added to the sum).
    """

    name: str
    bytes: int | None
    how: str
    why: str
    part_of: str | None = None

    def to_dict(self) -> TermDict:
        return TermDict(name=self.name, bytes=self.bytes, how=self.how, why=self.why, part_of=self.part_of)


def local_memory_model(stack_bytes: int, max_threads_per_sm: int, sm_count: int) -> int:
    """Local-memory reservation model: stack bytes per thread x resident threads per SM x SMs."""
    return int(stack_bytes) * int(max_threads_per_sm) * int(sm_count)


def round_up(n: int, unit: int = GRANULARITY) -> int:
    return -(-int(n) // unit) * unit


def budget_terms(b: Budget) -> list[Term]:
    """The equation's terms from a budget dict; sum of top-level rows == board total (+ unaccounted)."""
    total, reserved = b.get("nvml_total"), b.get("nvml_reserved")
    cuda_total = b["cuda_total"]
    rows: list[Term] = []
    if total is None:
        total = cuda_total
        rows.append(Term("board total", total, How.DERIVED,
                         "NVML unavailable: CUDA's total, which excludes the driver reservation"))
        reserved_row = Term("driver/firmware reservation", 0, How.UNAVAILABLE, "needs NVML")
    else:
        rows.append(Term("board total", total, How.MEASURED, "NVML total"))
        how, why = How.MEASURED, "NVML v2 'reserved'; CUDA's total already excludes it"
        if reserved is None:
            reserved, how, why = total - cuda_total, How.DERIVED, "NVML total - cudaMemGetInfo total"
        reserved_row = Term("driver/firmware reservation", int(reserved), how, why)
    rows.append(reserved_row)
    others, ctx = b.get("other_processes_bytes"), b.get("context_bytes")
    if others is not None and ctx is not None:
        rows.append(Term("in use before this process", int(others), How.MEASURED,
                         "NVML used before this process's context: other processes, driver state"))
        rows.append(Term("this process's context", int(ctx), How.MEASURED,
                         "NVML free before the context - cudaMemGetInfo free after it"))
    else:
        lump = int(b["context_and_others_bytes"]) - int(b.get("cupy_pool_total_bytes") or 0)
        rows.append(Term("context + other processes", lump, How.DERIVED,
                         "context already existed or NVML silent: cudaMemGetInfo total - free - pool"))
        ctx = None
    rows.extend(_context_parts(b, ctx))
    kl = b.get("kernel_local")
    if kl is not None:
        rows.append(Term("kernel module + local memory", int(kl["kept_bytes"]), How.MEASURED,
                         f"free drop kept after loading and launching a kernel with {kl['local_bytes']} "
                         "B local memory per thread"))
    pool = b.get("cupy_pool_total_bytes")
    rows.append(Term("user allocations (CuPy pool)", int(pool or 0), How.MEASURED if pool is not None
                     else How.UNAVAILABLE, "CuPy default pool total_bytes in this process"))
    final = b.get("final")
    free = b["cuda_free"] if final is None else final["cuda_free"]
    rows.append(Term("free", int(free), How.MEASURED, "cudaMemGetInfo free at the end"))
    summed = sum(int(r.bytes or 0) for r in rows[1:] if r.part_of is None)
    rows.append(Term("unaccounted", int(total) - summed, How.DERIVED,
                     "board total - every term above (drift of other processes, 2 MiB rounding)"))
    return rows


def _context_parts(b: Budget, ctx: int | None) -> list[Term]:
    """Estimated breakdown of the context cost; the rest is what the three models do not explain."""
    stack, heap, fifo = b.get("stack_size"), b.get("malloc_heap_size"), b.get("printf_fifo_size")
    if stack is None or heap is None or fifo is None:
        return []
    parent = "this process's context" if ctx is not None else "context + other processes"
    lm = b.get("local_memory_model_bytes") or local_memory_model(
        stack, b.get("max_threads_per_sm") or 0, b.get("sm_count") or 0)
    rows = [
        Term("  local memory (model)", int(lm), How.ESTIMATED,
             f"{stack} B stack/thread x {b.get('max_threads_per_sm')} threads/SM x {b.get('sm_count')} SMs",
             parent),
        Term("  device malloc heap", int(heap), How.ESTIMATED, "cudaLimitMallocHeapSize (limit, not usage)",
             parent),
        Term("  printf FIFO", int(fifo), How.ESTIMATED, "cudaLimitPrintfFifoSize", parent),
    ]
    if ctx is not None:
        rows.append(Term("  code, constants, driver (rest)", int(ctx) - int(lm) - int(heap) - int(fifo),
                         How.DERIVED, "context - the three estimates above", parent))
    return rows


def terms_add_up(terms: list[Term], tolerance: int = GRANULARITY) -> bool:
    """True when |unaccounted| is within ``tolerance`` bytes."""
    un = next(t for t in terms if t.name == "unaccounted")
    return abs(int(un.bytes or 0)) <= tolerance


def format_table(terms: list[Term]) -> str:
    """A plain-text table: term, bytes, MiB, how, why."""
    lines = [f"{'term':34} {'bytes':>17} {'MiB':>11}  {'how':11}  why"]
    for t in terms:
        b = "n/a" if t.bytes is None else f"{t.bytes:,}"
        mib = "" if t.bytes is None else f"{t.bytes / MiB:,.2f}"
        lines.append(f"{t.name:34} {b:>17} {mib:>11}  {t.how:11}  {t.why}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Check:
    """An independent consistency check between two measurements, within ``tolerance`` bytes."""

    name: str
    left: int
    right: int
    tolerance: int = GRANULARITY

    @property
    def difference(self) -> int:
        """left − right (bytes)."""
        return self.left - self.right

    @property
    def ok(self) -> bool:
        """|left − right| ≤ tolerance."""
        return abs(self.difference) <= self.tolerance

    def to_dict(self) -> CheckDict:
        return CheckDict(name=self.name, left=self.left, right=self.right, difference=self.difference,
                         tolerance=self.tolerance, ok=self.ok)


def cross_checks(b: Budget, terms: list[Term]) -> list[Check]:
    """Checks that compare figures obtained in different ways (NVML vs CUDA, before vs after)."""
    out = []
    total, reserved = b.get("nvml_total"), b.get("nvml_reserved")
    if total is not None and reserved is not None:
        out.append(Check("CUDA total = NVML total - NVML reserved", int(b["cuda_total"]),
                         int(total - reserved)))
    ub, ua, ctx = b.get("nvml_used_before"), b.get("nvml_used_after"), b.get("context_bytes")
    if ub is not None and ua is not None and ctx is not None and reserved is not None:
        out.append(Check("context: NVML used after - before = NVML free before - CUDA free", int(ua - ub),
                         int(ctx)))
    un = next(t for t in terms if t.name == "unaccounted")
    summed = int(next(t for t in terms if t.name == "board total").bytes or 0)
    out.append(Check("terms add up to the board total", summed - int(un.bytes or 0), summed))
    probe = b["probe"]["largest"] if "probe" in b else None
    if probe is not None:
        out.append(Check("largest single allocation = free memory (device not fragmented)",
                         int(probe["largest"]), int(probe["free"]), tolerance=8 * MiB))
    return out


def format_checks(checks: list[Check]) -> str:
    return "\n".join(
        f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.left:,} vs {c.right:,} "
        f"(difference {c.difference:,} B, tolerance {c.tolerance:,} B)" for c in checks
    )
