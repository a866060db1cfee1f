"""Where a GPU's memory goes before the first allocation: the seed's budget equation, measured.

``cheap_budget(device_id)`` (no kernel launch, no bisection) is what the
recorder stores in trace metadata under ``"budget"``; ``tracekit.budget.model``
turns a budget dict into the equation's terms and a table.
"""

from tracekit.budget.measure import BUDGET_KEYS, cheap_budget

__all__ = ["BUDGET_KEYS", "cheap_budget"]
