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

_HEAPS = ("device malloc heap", "printf FIFO")


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _bar(terms: dict[str, Term], at_oom: bool, label: str) -> BudgetBar:
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
    parts = [
        BudgetPart(name="other processes", bytes=val("other processes"), how=how("other processes")),
        BudgetPart(
            name="context",
            bytes=context,
            how=how("code, constants, driver (rest)")
            if val("code, constants, driver (rest)") is not None
            else how("this process outside the pool"),
        ),
        BudgetPart(name="local memory", bytes=local, how=how("local memory (model)")),
        BudgetPart(name="heaps", bytes=heaps, how=how("device malloc heap")),
        BudgetPart(name="pool reserved", bytes=val("pool reserved"), how=how("pool reserved")),
        BudgetPart(name="free", bytes=val("free"), how=how("free")),
        BudgetPart(name="unaccounted", bytes=val("unaccounted"), how=how("unaccounted")),
    ]
    return BudgetBar(label=label, parts=parts, total=val("device total"))


def budget_view(b: OOMBudget, oom_seq: int) -> Budget:
    """The start and OOM bars of ``b`` and the part that changed most."""
    terms = {
        t.name: t
        for t in b.terms
        if t.level == 0 or t.name in ("local memory (model)", "code, constants, driver (rest)", *_HEAPS)
    }
    start, oom = _bar(terms, False, "at start"), _bar(terms, True, f"at the OOM (seq {oom_seq})")
    moves = [
        (abs(o["bytes"] - s["bytes"]), o["name"], o["bytes"] - s["bytes"])
        for s, o in zip(start["parts"], oom["parts"], strict=True)
        if o["name"] not in ("free", "unaccounted") and s["bytes"] is not None and o["bytes"] is not None
    ]
    best = max(moves, default=None)
    changed = best[1] if best is not None and best[0] > 0 else None
    return Budget(
        start=start,
        oom=oom,
        changed=changed,
        change_bytes=best[2] if changed and best else None,
        takers=b.takers,
    )
