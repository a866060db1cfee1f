"""``--advise``: each member's recommendation from ``tracekit advise``, computed in its worker.

The search runs with one process (the fleet already runs one member per
CPU, and a pool's worker process may not start processes of its own). A
member the search cannot advise on (a trace that records neither a limit
nor a device size, say) keeps its row: ``advise_error`` says why and
``recommendation`` stays empty.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from tracekit.errors import TracekitError, UsageError

_ENGINE = "tracekit.advise.run"


def check_available() -> None:
    """UsageError when this installation has no advise engine (checked before any work)."""
    try:
        found = importlib.util.find_spec(_ENGINE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise UsageError("--advise needs the advise engine (tracekit.advise), which this installation lacks")


def recommend(trace: Any) -> tuple[str | None, str | None]:
    """(the recommendation sentence, None), or (None, why there is none) for this trace."""
    from tracekit.advise.run import advise  # type: ignore[import-not-found,unused-ignore]

    try:
        return str(advise(trace, jobs=1).recommendation()), None
    except TracekitError as e:
        return None, str(e)
