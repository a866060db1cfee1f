"""How exact a counterfactual prediction is: a replay of one recording against another real run.

BASE is a recording under one setting (the defaults) that ran out of memory; RUN is the
same program recorded under setting X. The prediction replays BASE, prepared as
counterfactual input (``tracekit.advise.counterfactual.prepare``), under X and RUN's limit,
with device addresses ordered as a real run would order them
(``counterfactual.counterfactual_replay``).
Both sides are reduced to *requests* (``malloc``, ``free``, ``oom`` rows, in order; rows of
a rebuilt starting state excluded) and to reserved bytes after each request:

    reserved_k = Σ size(segment_alloc) − Σ size(segment_free) over rows up to request k,

where a segment row belongs to the first request at or after it (the request that caused
it). Request k of BASE is compared with request k of RUN for k = 0 … K, K being BASE's
failing request (the whole trace when BASE did not fail); the comparison stops earlier
where the two programs stop making the same requests (same op, and the same size for
allocations), which is then reported. ``agree`` counts requests with equal reserved
bytes; ``first_departure`` is the first k where they differ (None: exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TypedDict

import numpy as np

from tracekit.advise.counterfactual import counterfactual_replay, initial_mask, prepare
from tracekit.sim import policies
from tracekit.sim.base import Allocator, PolicyRun, SimConfig
from tracekit.trace.events import segment_delta
from tracekit.trace.outcome import held_limit
from tracekit.trace.reader import Trace, read_trace
from tracekit.trace.schema import Op, Source
from tracekit.units import format_size


@dataclass(frozen=True)
class Requests:
    """Requests of a trace: input row, op code, size, and reserved bytes after each."""

    row: np.ndarray
    op: np.ndarray
    size: np.ndarray
    reserved: np.ndarray


def _requests(ev_op: np.ndarray, init: np.ndarray) -> np.ndarray:
    return ((ev_op == Op.MALLOC) | (ev_op == Op.FREE) | (ev_op == Op.OOM)) & ~init


def _owner(req: np.ndarray) -> np.ndarray:
    """Per row (and one past the end): the index of the first request at or after it (n: none)."""
    n = len(req)
    nxt = np.where(req, np.arange(n), n)
    return np.r_[np.minimum.accumulate(nxt[::-1])[::-1], n]


def recorded(trace: Trace) -> Requests:
    """Requests of a recording, reserved bytes from its own segment rows."""
    ev = trace.events
    init = initial_mask(trace)
    req = _requests(ev.op, init)
    delta = np.zeros(len(ev) + 1, np.int64)
    np.add.at(delta, _owner(req)[:-1], segment_delta(ev))
    idx = np.flatnonzero(req)
    return Requests(idx, ev.op[idx], ev.size[idx].astype(np.int64), np.cumsum(delta)[idx])


def predicted(trace: Trace, run: PolicyRun) -> Requests:
    """Requests of ``trace`` with reserved bytes from a replay's emitted rows."""
    ev = trace.events
    init = initial_mask(trace)
    req = _requests(ev.op, init)
    owner = _owner(req)[np.minimum(run.rows_before, len(ev))]
    sign = np.where(run.rows_op == Op.SEGMENT_ALLOC, 1, -1)
    delta = np.zeros(len(ev) + 1, np.int64)
    np.add.at(delta, owner, sign * run.rows_size.astype(np.int64))
    idx = np.flatnonzero(req)
    return Requests(idx, ev.op[idx], ev.size[idx].astype(np.int64), np.cumsum(delta)[idx])


class ComparisonDict(TypedDict):
    run: str
    setting: str
    compared: int
    same_requests: bool
    agree: int
    first_departure: int | None
    real_peak_reserved: int
    predicted_peak_reserved: int
    real_got_past: bool
    predicted_got_past: bool


class ComparisonTableDict(TypedDict):
    """``scripts/torch_counterfactual.py``'s JSON: the base recording and one row per run."""

    base: str
    runs: list[ComparisonDict]


@dataclass(frozen=True)
class Comparison:
    """One predicted run against the real one (request ordinals, bytes)."""

    run: str
    setting: str
    compared: int  # requests compared (through BASE's failing request, or fewer: see same_requests)
    same_requests: bool  # both programs made the same requests over the compared range
    agree: int
    first_departure: int | None
    real_peak_reserved: int
    predicted_peak_reserved: int
    real_got_past: bool  # the real run served BASE's failing request
    predicted_got_past: bool

    def to_dict(self) -> ComparisonDict:
        return ComparisonDict(
            run=self.run, setting=self.setting, compared=self.compared, same_requests=self.same_requests,
            agree=self.agree, first_departure=self.first_departure,
            real_peak_reserved=self.real_peak_reserved, predicted_peak_reserved=self.predicted_peak_reserved,
            real_got_past=self.real_got_past,
            predicted_got_past=self.predicted_got_past,
        )


def _is_alloc(op: np.ndarray) -> np.ndarray:
    return (op == Op.MALLOC) | (op == Op.OOM)


class Hints(StrEnum):
    """Which recorded hints a prediction uses (the ablation in ``docs/fidelity.md``)."""

    ALL = "all"  # every recorded hint as it is: releases, settings' releases, addresses
    INVENTED = "invented"  # prepared, every device address invented (no address hints)
    PREPARED = "prepared"  # allocator-internal releases removed; recorded addresses, new ones invented
    ORDERED = "ordered"  # prepared, and device addresses ordered as a real run would (the default)


def compare(base: Trace, run: Trace, setting: str, options: dict[str, str], policy: str,
            capacity: int | None, name: str = "", hints: Hints = Hints.ORDERED) -> Comparison:
    """Predict ``run`` from ``base`` under ``options`` and ``capacity``; compare per request."""
    cfg = SimConfig(capacity=capacity, options=options)
    if hints == Hints.ORDERED:
        prep, sim = counterfactual_replay(prepare(base), policy, cfg)
    else:
        from tracekit.sim.engine import replay

        prep = base if hints == Hints.ALL else prepare(base)
        if hints == Hints.INVENTED:
            cfg = SimConfig(capacity=capacity, options={**options, "addresses": "invent"})
        sim = replay(prep, policy, cfg)
    p, r = predicted(prep, sim.run), recorded(run)
    ooms = np.flatnonzero(p.op == Op.OOM)
    end = int(ooms[0]) + 1 if len(ooms) else len(p.op)
    end = min(end, len(r.op))
    alloc = _is_alloc(p.op[:end])
    # A free's recorded size is the block's and a PyTorch oom row's is the rounded request; the
    # setting's rounding changes both, so sizes are compared between successful requests only.
    sized = (p.op[:end] == Op.MALLOC) & (r.op[:end] == Op.MALLOC)
    same = (alloc == _is_alloc(r.op[:end])) & (~sized | (p.size[:end] == r.size[:end]))
    diff = np.flatnonzero(~same)
    k = int(diff[0]) if len(diff) else end
    miss = np.flatnonzero(p.reserved[:k] != r.reserved[:k])
    failed_at = int(ooms[0]) if len(ooms) else None
    got_past_pred = failed_at is None or sim.summary.oom is None or sim.summary.oom.seq > int(
        prep.events.seq[p.row[failed_at]])
    real_past = failed_at is None or (failed_at < len(r.op) and r.op[failed_at] == Op.MALLOC)
    return Comparison(
        run=name, setting=setting or "defaults", compared=k, same_requests=len(diff) == 0,
        agree=k - len(miss),
        first_departure=int(miss[0]) if len(miss) else None,
        real_peak_reserved=int(r.reserved[:k].max()) if k else 0,
        predicted_peak_reserved=int(p.reserved[:k].max()) if k else 0,
        real_got_past=bool(real_past), predicted_got_past=bool(got_past_pred),
    )


def run_setting(run: Trace) -> tuple[str, str, dict[str, str], int | None]:
    """(setting text, policy, options, capacity) that ``run`` was recorded under; the capacity is the
    limit it was held to (``held_limit``: one the program set itself counts)."""
    limit = held_limit(run.events, run.meta)
    if run.meta.source == Source.TORCH:
        from tracekit.sim.torch_rules import options_from_snapshot

        opts = options_from_snapshot(run.meta.recorded.torch_settings.snapshot)
        return _conf_text(opts), policies.modelling(Allocator.TORCH), opts, limit
    text = f"set_limit({format_size(limit)})" if limit else "no limit"
    return text, policies.modelling(Allocator.CUPY), {}, limit


def _conf_text(opts: dict[str, str]) -> str:
    """PyTorch's syntax, a uniform roundup_power2_divisions table written as one number."""
    from tracekit.advise.candidates import conf_text

    div = opts.get("roundup_power2_divisions", "")
    values = {v.split(":")[1] for v in div.strip("[]").split(",")} if div.startswith("[") else set()
    if len(values) == 1:
        opts = {**opts, "roundup_power2_divisions": values.pop()}
    return conf_text(opts)


@dataclass(frozen=True)
class ComparisonTable:
    base: str
    rows: tuple[Comparison, ...]

    def to_dict(self) -> ComparisonTableDict:
        return ComparisonTableDict(base=self.base, runs=[r.to_dict() for r in self.rows])

    def to_markdown(self) -> str:
        lines = [
            "| run | setting | requests compared | reserved agrees | first departure | real / predicted "
            "peak reserved | real / predicted past the failing request |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in self.rows:
            dep = "none" if c.first_departure is None else f"request {c.first_departure:,}"
            if not c.same_requests:
                dep += " (requests differ after the compared range)"
            lines.append(
                f"| {c.run} | `{c.setting}` | {c.compared:,} | {c.agree:,} | {dep} | "
                f"{format_size(c.real_peak_reserved)} / {format_size(c.predicted_peak_reserved)} | "
                f"{'yes' if c.real_got_past else 'no'} / {'yes' if c.predicted_got_past else 'no'} |"
            )
        return "\n".join(lines)


def compare_runs(base_path: Path, run_paths: list[Path], hints: Hints = Hints.ORDERED) -> ComparisonTable:
    """Every run predicted from the base recording (see the module docstring)."""
    base = read_trace(base_path)
    rows = []
    for path in run_paths:
        run = read_trace(path)
        setting, policy, opts, cap = run_setting(run)
        rows.append(compare(base, run, setting, opts, policy, cap, Path(path).name, hints))
    return ComparisonTable(Path(base_path).name, tuple(rows))
