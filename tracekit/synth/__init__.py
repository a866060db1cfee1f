"""``tracekit synth``: write a valid trace from a synthetic allocation pattern.

Generation is vectorized in chunks and written in row groups, so memory stays
bounded (a few chunks of 2^20 events) whatever the event count. Times are a
running sum of exponential gaps (mean 2 µs), so the trace has a real time axis.
Requests carry whole call stacks (``tracekit.synth.stacks``: ``stacks`` distinct
ones, drawn from a generator of their own so the other columns are those of the
same seed without stacks); ``stacks=0`` leaves the call-sites as one-frame stacks.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

import numpy as np

from tracekit import progress
from tracekit.errors import UsageError
from tracekit.outputs import check_output
from tracekit.synth.patterns import fragmenting_pattern, random_pattern, training_pattern
from tracekit.synth.stacks import DEFAULT_STACKS, Program, assign, program
from tracekit.trace.events import Events
from tracekit.trace.schema import Source, TraceMeta
from tracekit.trace.writer import TraceWriter


class Pattern(StrEnum):
    TRAINING = "training"
    RANDOM = "random"
    FRAGMENTING = "fragmenting"


_GENERATORS = {
    Pattern.TRAINING: training_pattern,
    Pattern.RANDOM: random_pattern,
    Pattern.FRAGMENTING: fragmenting_pattern,
}


# Bounds on the options: a trace beyond a billion events takes over ten minutes and
# tens of GB to write, which is never what a test workload needs; NumPy seeds are
# non-negative and stored in the metadata as JSON integers.
MAX_EVENTS = 1_000_000_000
MAX_SEED = 2**64 - 1
MAX_STACKS = 100_000  # distinct synthetic stacks: beyond any program's, and the table stays a few MB


def synthesize(pattern: Pattern, events: int, seed: int, output: Path, *, force: bool = False,
               stacks: int = DEFAULT_STACKS) -> Path:
    """Write exactly ``events`` events of ``pattern`` to ``output`` (existing: only with ``force``)."""
    if not 0 < events <= MAX_EVENTS:
        raise UsageError(f"--events must be between 1 and {MAX_EVENTS:,}, got {events:,}")
    if not 0 <= seed <= MAX_SEED:
        raise UsageError(f"--seed must be between 0 and 2^64-1, got {seed}")
    if not 0 <= stacks <= MAX_STACKS:
        raise UsageError(f"--stacks must be between 0 and {MAX_STACKS:,}, got {stacks:,}")
    check_output(output, force=force)
    rng = np.random.default_rng(seed)
    meta = TraceMeta.new(Source.SYNTHETIC).with_extra(
        synth={"pattern": pattern.value, "events": events, "seed": seed, "stacks": stacks}
    )
    stack_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    programs: dict[tuple[str, ...], Program | None] = {}
    written = 0
    t0 = 0
    with TraceWriter(output, meta) as w:
        for batch in _GENERATORS[pattern](events, rng):
            take = min(len(batch), events - written)
            if take <= 0:
                break
            gaps = rng.exponential(2000.0, take).astype(np.int64) + 1
            t = t0 + np.cumsum(gaps)
            t0 = int(t[-1])
            b = batch.take(slice(0, take))
            if b.sites not in programs:
                programs[b.sites] = program(b.sites, stacks, stack_rng)
            prog = programs[b.sites]
            w.write(Events.build(
                b.op, b.size, addr=b.addr, rounded=b.rounded, stream=b.stream, device=b.device, site=b.site,
                sites=b.sites, seq=np.arange(written, written + take, dtype=np.uint64), t_ns=t,
                stack=None if prog is None else assign(prog, b.op, b.site, stack_rng),
                stacks=None if prog is None else prog.table))
            written += take
            progress.report(written, events)
    return output

