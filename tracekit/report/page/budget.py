"""The device budget as two stacked bars (at start, at one OOM), from the analyzer's ``OOMBudget``.

Each bar splits the device total into: other processes + context (code, constants,
driver) + local memory + heaps (device malloc heap + printf FIFO) + pool reserved + free
+ unaccounted (bytes; each part says how it was had: measured, estimated or derived).
Nothing is recomputed: every figure is a term of ``tracekit.analysis.oom_budget``.
Where the three estimated parts of the process are unknown, context is the whole of
"this process outside the pool". The term named as changed is the part (free aside,
which only answers the others) whose bytes moved most between the two bars.
"""

from __future__ import annotations

from tracekit.analysis.oom_budget import OOMBudget, Term
from tracekit.report.page.model import Budget, BudgetBar, BudgetPart
from tracekit.units import format_size

_HEAPS = ("device malloc heap", "printf FIFO")


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _bar(terms: dict[str, Term], at_oom: bool, label: str) -> tuple[BudgetBar, dict[str, int | None]]:
    """One bar, and its parts' bytes by name (what the caller compares, without reading the bar back)."""

    def val(name: str) -> int | None:
        t = terms.get(name)
        return None if t is None else (t.oom if at_oom else t.start)

    def how(name: str) -> str:
        t = terms.get(name)
        return "unknown" if t is None else (t.how_oom if at_oom else t.how_start).value

    local, heaps = val("local memory (model)"), _sum([val(h) for h in _HEAPS])
    context = val("code, constants, driver (rest)")
    if context is None and val("this process outside the pool") is not None:
        context = _sum([val("this process outside the pool"), -(local or 0), -(heaps or 0)])
    context_how = (how("code, constants, driver (rest)") if val("code, constants, driver (rest)") is not None
                   else how("this process outside the pool"))
    values: dict[str, tuple[int | None, str]] = {
        "other processes": (val("other processes"), how("other processes")),
        "context": (context, context_how),
        "local memory": (local, how("local memory (model)")),
        "heaps": (heaps, how("device malloc heap")),
        "pool reserved": (val("pool reserved"), how("pool reserved")),
        "free": (val("free"), how("free")),
        "unaccounted": (val("unaccounted"), how("unaccounted")),
    }
    parts = [BudgetPart(name=name, bytes=n, how=h) for name, (n, h) in values.items()]
    bar = BudgetBar(label=label, parts=parts, total=val("device total"))
    return bar, {k: v[0] for k, v in values.items()}


def capped_sentence(limit: int | None, free: int | None, what: str = "pool limit") -> str | None:
    """Said under the bars where the pool had a cap and the device had more free than the whole cap at
    the OOM: the cap ran out, not the device."""
    if limit is None or free is None or free <= limit:
        return None
    return (f"pool capped at {format_size(limit)} ({what}): the device had {format_size(free)} free at the "
            f"OOM, so the cap ran out, not the device")


def budget_view(b: OOMBudget, oom_seq: int, limit: int | None = None,
                limit_what: str = "pool limit") -> Budget:
    """The start and OOM bars of ``b`` and the part that changed most; ``limit``: the pool's cap."""
    terms = {
        t.name: t
        for t in b.terms
        if t.level == 0 or t.name in ("local memory (model)", "code, constants, driver (rest)", *_HEAPS)
    }
    start, was = _bar(terms, False, "at start")
    oom, now = _bar(terms, True, f"at the OOM (seq {oom_seq})")
    moves = [
        (abs(n - w), name, n - w)
        for name, w in was.items()
        if name not in ("free", "unaccounted") and w is not None and (n := now.get(name)) is not None
    ]
    best = max(moves, default=None)
    changed = best[1] if best is not None and best[0] > 0 else None
    return Budget(
        start=start,
        oom=oom,
        changed=changed,
        change_bytes=best[2] if changed and best else None,
        takers=b.takers,
        pool_limit=limit,
        capped=capped_sentence(limit, now.get("free"), limit_what),
    )
