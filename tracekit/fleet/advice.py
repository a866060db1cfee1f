"""``--advise``: each member's recommendation from ``tracekit advise``, computed in its worker.

The search runs with one process (the fleet already runs one member per
CPU, and a pool's worker process may not start processes of its own). A
member the search cannot advise on (a trace that records neither a limit
nor a device size, say) keeps its row: ``advise_error`` says why and
``recommendation`` stays empty.
"""

from __future__ import annotations

from typing import Any

from tracekit.errors import TracekitError
from tracekit.trace.stacks import UserCode


def recommend(trace: Any, user_code: UserCode = UserCode()) -> tuple[str | None, str | None]:
    """(the recommendation sentence, None), or (None, why there is none) for this trace."""
    from tracekit.advise.run import advise

    try:
        return str(advise(trace, jobs=1, user_code=user_code).recommendation()), None
    except TracekitError as e:
        return None, str(e)
