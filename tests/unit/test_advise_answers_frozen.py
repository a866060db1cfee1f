"""``advise``'s answers, frozen before its speed work (issue 45 item 4): speed changes no answer.

Every committed trace under ``traces/`` (PyTorch and CuPy recordings, with and without OOMs,
handled ones included), some of them relabelled as raw traces or asked under a limit of the
user's, and three synthetic traces (``data/advise_frozen``) relabelled as PyTorch, CuPy and
raw traces limited 2 % above their live peak (the worst case: little fits and the bisections
run) go through ``advise``; its whole ``--json`` document must equal the one the code gave
when the golden file was written. One case runs on two threads (side by side, the answers
must be those of the search in one thread).

To regenerate the golden (only for a change that is meant to change answers, said in the
commit): ``TRACEKIT_FREEZE_ADVISE=1 .venv/bin/python -m pytest -q -p no:cacheprovider
tests/unit/test_advise_answers_frozen.py``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tracekit.advise.capacity import lower_bound
from tracekit.advise.run import advise
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Source

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data" / "advise_frozen"
GOLDEN = DATA / "golden.json"
SOURCES = {"torch": Source.TORCH, "cupy": Source.CUPY, "raw": Source.SYNTHETIC}


@dataclass(frozen=True)
class Case:
    """``path`` (relative to the repository) advised as it is, or relabelled ``as_kind`` with its
    pool limit ``limit_ratio`` x its live-bytes lower bound (raw: given as ``--limit``); ``ask``:
    the same ratio given as the user's ``--limit`` instead."""

    path: str
    as_kind: str | None = None
    limit_ratio: float | None = None
    ask: bool = False
    device_total_ratio: float | None = None
    jobs: int = 1

    @property
    def name(self) -> str:
        parts = [self.path]
        if self.as_kind:
            parts.append(f"as-{self.as_kind}")
        if self.limit_ratio:
            parts.append(f"{'ask' if self.ask else 'limit'}-{self.limit_ratio}")
        if self.device_total_ratio:
            parts.append(f"total-{self.device_total_ratio}")
        if self.jobs != 1:
            parts.append(f"jobs-{self.jobs}")
        return ":".join(parts)


def _cases() -> list[Case]:
    traces = ROOT / "traces"
    committed = [*traces.glob("*.parquet"), *(traces / "counterfactual").glob("*.parquet")]
    out = [Case(str(p.relative_to(ROOT))) for p in sorted(committed)]
    for p in sorted(DATA.glob("synth-*.parquet")):
        out += [Case(str(p.relative_to(ROOT)), kind, 1.02) for kind in SOURCES]
    out += [
        Case("traces/torch-oom.parquet", "raw", 1.05),
        Case("traces/cupy-mlp.parquet", "raw", 1.05),
        Case("traces/torch-gpt2-lengths.parquet", "raw", 1.1),
        Case("traces/torch-oom.parquet", limit_ratio=1.05, ask=True),
        Case("traces/torch-gpt2-lengths.parquet", limit_ratio=1.02, ask=True),
        Case("traces/torch-train.parquet", limit_ratio=1.1, ask=True, device_total_ratio=1.3),
        Case("traces/cupy-sort.parquet", limit_ratio=1.02, ask=True),
        Case(str((DATA / "synth-random-10k.parquet").relative_to(ROOT)), "torch", 1.02, jobs=2),
    ]
    return out


CASES = _cases()


@cache
def _read(path: str) -> Trace:
    return read_trace(ROOT / path)


def answer(case: Case) -> dict[str, Any]:
    """The case's ``advise --json`` document, as JSON reads it back."""
    t = _read(case.path)
    limit = total = None
    if case.limit_ratio is not None:
        limit = int(lower_bound(t) * case.limit_ratio) // 512 * 512
    if case.device_total_ratio is not None:
        total = int(lower_bound(t) * case.device_total_ratio) // 512 * 512
    if case.as_kind is not None:
        t = replace(t, meta=replace(t.meta, source=SOURCES[case.as_kind], pool_limit_bytes=limit))
        limit = limit if case.as_kind == "raw" else None
    elif not case.ask:
        limit = None
    doc = advise(t, limit=limit, device_total=total, jobs=case.jobs).as_json()
    return json.loads(json.dumps(doc).replace(json.dumps(str(ROOT))[1:-1] + "/", ""))  # paths as committed


def _golden() -> dict[str, Any]:
    if os.environ.get("TRACEKIT_FREEZE_ADVISE") == "1" and not getattr(_golden, "written", False):
        GOLDEN.write_text(json.dumps({c.name: answer(c) for c in CASES}, indent=1, sort_keys=True) + "\n")
        _golden.written = True  # type: ignore[attr-defined]
    data: dict[str, Any] = json.loads(GOLDEN.read_text())
    return data


def test_every_case_is_frozen():
    assert sorted(_golden()) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_advise_answer_is_frozen(case: Case):
    want = _golden()[case.name]
    got = answer(case)
    for key in sorted(set(want) | set(got)):  # the first field that differs, named
        assert got.get(key) == want.get(key), key
    assert got == want
