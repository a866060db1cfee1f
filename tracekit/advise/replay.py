"""A trace file replayed through a simulated allocator, as ``advise`` and ``whatif`` predict it.

``replay --sim`` is this module: the recording is prepared as counterfactual input
(``tracekit.advise.counterfactual.predict``), so the three verbs give one answer for one
setting; ``as_recorded`` replays it exactly as recorded. It lives in advise (not in ``sim/``)
because the prediction is advise's: the simulator below knows nothing of it.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tracekit import progress
from tracekit.outputs import check_output
from tracekit.sim import policies
from tracekit.sim.head_start import head_start
from tracekit.trace.reader import read_trace

if TYPE_CHECKING:
    from tracekit.sim.base import SimConfig
    from tracekit.sim.result import ReplayResult


def replay_file(
    path: str | os.PathLike[str],
    policy: str,
    config: SimConfig,
    *,
    output: str | os.PathLike[str] | None = None,
    command: str | None = None,
    on_progress: progress.Callback | None = None,
    force: bool = False,
    as_recorded: bool = False,
    pool: int | None = None,
) -> ReplayResult:
    """Read the trace at ``path``, replay it, and write the replay to ``output`` if given.

    The replay is the prediction ``advise`` and ``whatif`` make for the same setting
    (``tracekit.advise.counterfactual.predict``: a recording under a pool policy is prepared
    as counterfactual input); ``as_recorded`` replays the recording exactly as recorded,
    every hint kept. ``pool``: that pool's rows alone (``trace.devices.only_pool``; CuPy's pools
    never share memory), one sentence where the trace has none of it. The policy name and the output
    path are checked before the trace is read, so a typo costs nothing on a large file; an existing
    output is refused unless ``force``.
    """
    model = policies.get(policy)
    if output is not None:
        check_output(Path(output), (Path(path),), force=force)
    # A policy that replays in steps starts on the rows read while the reader reads the next ones.
    # One pool's rows are known only once the whole trace is read: no start during the read then.
    with head_start(model, config) if pool is None else nullcontext() as head:
        # extras too: policies start from an imported `initial` state
        trace = read_trace(path, on_window=head.take if head is not None else None)
        if pool is not None:
            from tracekit.trace.devices import only_pool

            trace = only_pool(trace, pool)
        # Imported once the trace is read (issue 45: nothing a verb needs only after reading is loaded
        # before it); the counterfactual preparation only where it is used.
        from tracekit.sim.engine import replay, write_replay

        with progress.reporting(on_progress):
            if as_recorded:
                replayed, result = trace, replay(trace, policy, config, head)
            else:
                from tracekit.advise.counterfactual import predict

                replayed, result = predict(trace, policy, config, head)
    if output is not None:
        write_replay(result, replayed, output, command=command)
    skipped = tuple(f"skipped {i.describe()}" for i in trace.issues)
    return replace(result, warnings=skipped + result.warnings)
