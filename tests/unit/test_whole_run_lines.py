"""The commands a run that died is given, as data (``AdviseResult.whole_run_lines``, shown on the report
page with a copy button) and as the recommendation's sentence: the same branches, the same words."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tracekit.advise.run import advise
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import Source

TRACES = Path(__file__).resolve().parents[2] / "traces"
SAID = "record the whole run once with room to finish ("

# (trace, advise's --limit or None, relabelled raw): fits, borderline, fit capacity, smallest capacity, the
# device itself ran out, runs that completed
CASES = [
    ("torch-oom", None, False), ("torch-handled-oom", None, False), ("torch-resnet35", None, False),
    ("torch-resnet35", 4 << 30, False), ("cupy-oom-frag", None, False), ("cupy-oom-frag", 150 << 20, False),
    ("cupy-oom-frag", 200 << 20, True), ("cupy-seed", None, False), ("torch-expandable", None, False),
    ("torch-dcgan", None, False), ("fidelity/whole-run/whole", 4575985664, False),
    ("fidelity/whole-run/gpt2/capped", None, False),
    ("fidelity/user-pool-limit/user-pool-limit", None, False),  # the program's own pool
]


@pytest.mark.parametrize(("name", "limit", "raw"), CASES, ids=[f"{n}-{lim}-{r}" for n, lim, r in CASES])
def test_the_lines_are_the_sentences(name: str, limit: int | None, raw: bool) -> None:
    t = read_trace(TRACES / f"{name}.parquet")
    if raw:
        t = replace(t, meta=replace(t.meta, source=Source.SYNTHETIC))
    r = advise(t, limit=limit, jobs=1)
    text, lines = r.recommendation(), r.whole_run_lines()
    assert bool(lines) == (SAID in text), (text, lines)
    if lines and r.pool is not None:  # advise --limit asks the default pool's question, not this one
        (record,) = lines
        assert record.startswith("tracekit record") and record in text and "tracekit advise" not in text
    elif lines:
        record, again = lines
        assert r.failing_seq is not None and record.startswith("tracekit record") and record in text
        assert again == f"tracekit advise {Path(name).name}-whole.parquet --limit {r.limit}" and again in text
    if r.failing_seq is None or r.room is not None:
        assert lines == () and "record the whole run" not in text
