"""The fleet table's row: one trace's identity, peaks, fatal OOM and leaks, as plain scalars.

A ``TraceRow`` is what a worker sends back to the driver (a few hundred
bytes), so the driver's memory grows with the number of traces, never with
their size. Identity: the rank comes from the trace's ``launch`` metadata
(``rank``, ``local_rank``, ``world_size``, ``host``, written by the recorder
under a launcher), else from the file name (``rank3``, ``rank-3``,
``rank_3``, ``ddp.rank0.parquet``); ``rank_from`` says which. Figures are
the analyzer's (``docs/analysis.md``): bytes, event ``seq`` numbers,
``duration_s`` = last ``t_ns`` − first ``t_ns`` in seconds, external
fragmentation = 1 − largest free block / free in pool. A trace that ran out
of memory has a fatal OOM (the one the program died of, ``oom_*`` columns);
OOMs the program survived are counted in ``ooms_handled`` (``oom_count`` counts
all). A trace of several devices gives the figures of the device the
analyzer reports (``device_index``: the fatal OOM's device, else the one with
the highest peak reserved). ``oom_site`` is the fatal OOM's call-site label (the
user's line and the library line that made the request, ``tracekit.trace.callsite``),
``oom_user_site`` and ``oom_request_site`` those two frames as ``path:line:function``.
``seconds`` is the wall time the worker spent on the member (read + analyze + options).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from tracekit.analysis.summary import OOMReport, Summary
from tracekit.record.launch import Launch
from tracekit.trace.schema import TraceMeta

# At most 18 digits: every rank the name can give fits the table's int64 column.
_RANK_IN_NAME = re.compile(r"(?<![a-z])rank[-_.]?(\d{1,18})(?!\d)", re.IGNORECASE)
INT64_END = 1 << 63  # a table column of integers is int64: [-2^63, 2^63)


class RankFrom(StrEnum):
    """Where a row's rank came from."""

    LAUNCH = "launch"  # the trace's ``launch`` metadata
    FILE_NAME = "file name"


def rank_from_name(path: Path) -> int | None:
    """The rank written in a file name (``ddp.rank1.parquet`` → 1), None when there is none."""
    found = _RANK_IN_NAME.findall(path.name)
    return int(found[-1]) if found else None


def launch_fields(path: Path, meta: TraceMeta) -> tuple[Launch, RankFrom | None]:
    """The trace's ``launch`` metadata, its rank else the one in the file name; and where it came from."""
    launch = _usable(Launch.from_meta(meta.extra.get("launch")))
    if launch.rank is not None:
        return launch, RankFrom.LAUNCH
    return _name_rank(path, launch)


def _usable(launch: Launch) -> Launch:
    """``launch`` with a rank or local rank outside [0, 2^63), or a world size outside [1, 2^63),
    taken as unknown (None): no launcher numbers its processes so, and the table holds int64."""
    def within(v: int | None, lo: int) -> int | None:
        return v if v is not None and lo <= v < INT64_END else None

    return replace(launch, rank=within(launch.rank, 0), local_rank=within(launch.local_rank, 0),
                   world_size=within(launch.world_size, 1))


def _name_rank(path: Path, launch: Launch = Launch()) -> tuple[Launch, RankFrom | None]:
    named = rank_from_name(path)
    return replace(launch, rank=named), RankFrom.FILE_NAME if named is not None else None


@dataclass(frozen=True)
class TraceRow:
    """One trace of the fleet (bytes unless named; ``*_seq`` are event seq numbers)."""

    path: str
    error: str | None = None
    source: str | None = None
    device: str | None = None
    device_index: int | None = None
    launch: Launch = field(default_factory=Launch)
    rank_from: RankFrom | None = None
    events: int | None = None
    duration_s: float | None = None
    peak_live_bytes: int | None = None
    peak_live_seq: int | None = None
    peak_reserved_bytes: int | None = None
    peak_reserved_seq: int | None = None
    max_external_fragmentation: float | None = None
    oom_count: int | None = None
    ooms_handled: int | None = None
    oom_device: int | None = None
    oom_seq: int | None = None
    oom_size: int | None = None
    oom_site: str | None = None
    oom_user_site: str | None = None
    oom_request_site: str | None = None
    oom_diagnosis: str | None = None
    oom_explanation: str | None = None
    oom_device_free_bytes: int | None = None
    oom_device_free_source: str | None = None
    oom_outside_pool_bytes: int | None = None
    oom_other_processes_bytes: int | None = None
    leaked_bytes: int | None = None
    limit_bytes: int | None = None
    whatif_lower_bound: int | None = None
    min_capacity: tuple[tuple[str, int | None], ...] = ()
    advised: bool = False
    recommendation: str | None = None
    advise_error: str | None = None
    curve: Any = None  # a member.Curve when the report's heat map was asked for
    seconds: float = 0.0

    @classmethod
    def failed(cls, path: str, error: str, seconds: float) -> TraceRow:
        """The row of a member that could not be read or analyzed."""
        launch, rank_from = _name_rank(Path(path))
        return cls(path=path, error=error, launch=launch, rank_from=rank_from, seconds=seconds)

    @classmethod
    def from_summary(cls, path: str, meta: TraceMeta, s: Summary, launch: Launch,
                     rank_from: RankFrom | None, *,
                     device_index: int | None, whatif: Any = None,
                     advice: tuple[str | None, str | None] | None = None,
                     curve: Any = None, seconds: float = 0.0) -> TraceRow:
        """Cut the analyzer's summary (and the optional what-if result) down to a row.

        The OOM columns describe the fatal OOM (the one the program died of); the handled
        ones, which the program survived, are only counted.
        """
        oom = s.oom if s.oom is not None and not s.oom.handled else None
        fits = tuple((f.policy, f.min_capacity) for f in whatif.fits) if whatif is not None else ()
        return cls(
            path=path, source=meta.source.value, device=_text(s.context.device_name),
            device_index=device_index,
            launch=launch, rank_from=rank_from, events=s.events, duration_s=s.duration_s,
            peak_live_bytes=s.peak_live_bytes, peak_live_seq=s.peak_live_seq,
            peak_reserved_bytes=s.peak_reserved_bytes, peak_reserved_seq=s.peak_reserved_seq,
            max_external_fragmentation=s.max_external_fragmentation, oom_count=s.oom_events,
            ooms_handled=sum(o.handled for o in s.ooms), oom_device=oom.device if oom else None,
            oom_seq=oom.seq if oom else None, oom_size=oom.size if oom else None,
            oom_site=oom.site if oom else None, oom_user_site=oom.user_site if oom else None,
            oom_request_site=oom.request_site if oom else None,
            oom_diagnosis=oom.diagnosis.value if oom else None,
            oom_explanation=oom.explanation if oom else None,
            oom_device_free_bytes=oom.device_free if oom else None,
            oom_device_free_source=oom.device_free_source.value if oom else None,
            oom_outside_pool_bytes=_at_oom(oom, OUTSIDE_POOL), oom_other_processes_bytes=_at_oom(oom, OTHERS),
            leaked_bytes=s.leaked_bytes,
            limit_bytes=s.context.limit,
            whatif_lower_bound=whatif.lower_bound if whatif is not None else None, min_capacity=fits,
            advised=advice is not None, recommendation=advice[0] if advice else None,
            advise_error=advice[1] if advice else None, curve=curve, seconds=seconds,
        )

    def record(self) -> dict[str, Any]:
        """The row as flat columns (the Parquet table's and ``--json``'s ``rows``), curve excluded."""
        d: dict[str, Any] = {"path": self.path, "error": self.error, "source": self.source,
                             "device": self.device, "device_index": self.device_index,
                             "rank": self.launch.rank,
                             "rank_from": self.rank_from.value if self.rank_from else None,
                             "local_rank": self.launch.local_rank, "world_size": self.launch.world_size,
                             "host": self.launch.host}
        for name in _FIGURES:
            d[name] = getattr(self, name)
        if self.whatif_lower_bound is not None:
            d["whatif_lower_bound_bytes"] = self.whatif_lower_bound
        for policy, cap in self.min_capacity:
            d[capacity_column(policy)] = cap
        if self.advised:
            d["recommendation"] = self.recommendation
            d["advise_error"] = self.advise_error
        d["seconds"] = self.seconds
        return {k: storable(v) if isinstance(v, str) else v for k, v in d.items()}


def _text(v: Any) -> str | None:
    """A name from the metadata where it is text; anything else there (a number, an object) is no name."""
    return v if isinstance(v, str) else None


def storable(text: str) -> str:
    """``text`` as valid UTF-8, which a table column must be: a byte of a non-UTF-8 file name (held
    by Python as a lone surrogate) becomes ``\\udcff``, as ``repr`` writes it; other text unchanged."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# Terms of the device budget at the OOM (tracekit.analysis.oom_budget) that a row keeps.
OUTSIDE_POOL = "this process outside the pool"  # CUDA context, NCCL, cuDNN/cuBLAS workspaces, ...
OTHERS = "other processes"


def _at_oom(oom: OOMReport | None, term: str) -> int | None:
    """A budget term's figure at the OOM (bytes), None where the recording could not tell."""
    if oom is None or oom.budget is None:
        return None
    return next((t.oom for t in oom.budget.terms if t.name == term), None)


def capacity_column(policy: str) -> str:
    """The column holding a policy's smallest capacity: ``min_capacity_best_fit_bytes``."""
    return f"min_capacity_{policy.replace('-', '_')}_bytes"


_FIGURES = (
    "events", "duration_s", "peak_live_bytes", "peak_live_seq", "peak_reserved_bytes",
    "peak_reserved_seq", "max_external_fragmentation", "oom_count", "ooms_handled", "oom_device",
    "oom_seq", "oom_size", "oom_site", "oom_user_site", "oom_request_site", "oom_diagnosis",
    "oom_explanation", "oom_device_free_bytes", "oom_device_free_source", "oom_outside_pool_bytes",
    "oom_other_processes_bytes", "leaked_bytes", "limit_bytes",
)
