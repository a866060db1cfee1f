"""The budget as the verb prints it: measured terms, checks and probe results, as text or JSON."""

from __future__ import annotations

import json
from typing import TypedDict

from tracekit.budget.kernel_probe import MAX_LOCAL
from tracekit.budget.measure import measure_budget
from tracekit.budget.model import (
    Check,
    CheckDict,
    MiB,
    Term,
    TermDict,
    budget_terms,
    cross_checks,
    format_checks,
    format_table,
)
from tracekit.budget.shapes import Budget
from tracekit.errors import UsageError


class EquationDict(TypedDict):
    """What ``budget --json`` adds after the measured figures (``tracekit.budget.measure``)."""

    terms: list[TermDict]
    checks: list[CheckDict]


def equation(terms: list[Term], checks: list[Check]) -> EquationDict:
    """The equation's rows and checks as JSON."""
    return EquationDict(terms=[t.to_dict() for t in terms], checks=[c.to_dict() for c in checks])


def budget_report(device: int, kernel_local_bytes: int | None, probe_largest: bool, as_json: bool) -> str:
    """Measure the budget of ``device`` and render it (a table with notes, or one JSON document)."""
    if device < 0:
        raise UsageError(f"--device must be a CUDA device ordinal (0, 1, ...), got {device}")
    if kernel_local_bytes is not None and not 4 <= kernel_local_bytes <= MAX_LOCAL:
        raise UsageError(f"--kernel-local-bytes must be between 4 and {MAX_LOCAL:,}, "
                         f"got {kernel_local_bytes}")
    b = measure_budget(device, kernel_local_bytes, probe_largest)
    terms = budget_terms(b)
    checks = cross_checks(b, terms)
    if as_json:
        return json.dumps({**b, **equation(terms, checks)}, indent=2, default=str)
    return render_text(b, terms, checks)


def render_text(b: Budget, terms: list[Term], checks: list[Check]) -> str:
    """Header, the equation table, the checks, then one paragraph per probe."""
    head = (f"device {b['device']}: {b.get('name')}  driver {b.get('driver_version')}  "
            f"CUDA driver {b.get('cuda_driver_version')} runtime {b.get('cuda_runtime_version')}")
    parts = [head, "", format_table(terms), "", format_checks(checks)]
    if b.get("context_existed"):
        parts.append("note: this process already had a context, so its cost is lumped with other processes")
    kl = b.get("kernel_local")
    if kl:
        parts += ["", f"kernel with {kl['local_bytes']:,} B local memory per thread "
                  f"(compiled: {kl['local_size_bytes']:,} B; grid {kl['grid']} x {kl['block']}):",
                  f"  load {kl['load_bytes'] / MiB:,.2f} MiB, launch {kl['launch_bytes'] / MiB:,.2f} MiB, "
                  f"kept {kl['kept_bytes'] / MiB:,.2f} MiB; model {kl['model_bytes'] / MiB:,.2f} MiB "
                  f"(launch/model {kl['launch_over_model'] or 0:.4f})",
                  f"  stack limit {kl['stack_size_before']:,} -> {kl['stack_size_after']:,} B per thread; "
                  f"setting it back gave back {_mib(kl['restore_gave_back'])}"]
    pr = b.get("probe")
    if pr:
        lg = pr["largest"]
        parts += ["", f"largest single allocation {lg['largest']:,} B of {lg['free']:,} B free "
                  f"({100 * (lg['fraction'] or 0):.3f}%, gap {lg['gap'] / MiB:.2f} MiB, "
                  f"{lg['attempts']} tries)",
                  "granularity (free-memory drop for 4 allocations of each size):"]
        parts += [f"  request {g['request']:>12,} B x {g['count']}: {g['cost']:>12,} B, pointers aligned to "
                  f"{g['alignment']:,} B" for g in pr["granularity"]]
    return "\n".join(parts)


def _mib(n: int | None) -> str:
    return "n/a" if n is None else f"{n / MiB:,.2f} MiB"
