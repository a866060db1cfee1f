"""Across the fleet: who ran out of memory and why, how uneven the ranks are, the worst trace.

Queries over the fleet table (polars), over the members that were analyzed
(rows without ``error``):

- **by diagnosis / by call-site**: the traces with a fatal OOM grouped by the
  analyzer's diagnosis, and by the failing request's call-site, largest
  group first (``traces``, their ``ranks`` where known, ``paths``).
- **imbalance** of peak reserved bytes across ranks (across all analyzed
  traces when none has a rank): ``max_bytes``, ``median_bytes`` and
  ``ratio`` = max / median (1.0 = perfectly even); the rank or path at the max.
- **worst**: traces that ran out of memory come first, then the highest peak
  reserved bytes; the pointer is the command that draws its single-trace
  report.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from tracekit.analysis.summary import site_text
from tracekit.units import format_size


@dataclass(frozen=True)
class Group:
    """Traces that share a diagnosis or a call-site (``key`` None: no call-site recorded)."""

    key: str | None
    traces: int
    ranks: tuple[int, ...]
    paths: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "traces": self.traces, "ranks": list(self.ranks), "paths": list(self.paths)}


@dataclass(frozen=True)
class Imbalance:
    """Peak reserved bytes across ranks: max, median and max / median."""

    over: str  # "ranks" or "traces"
    count: int
    max_bytes: int
    median_bytes: float
    max_rank: int | None
    max_path: str

    @property
    def ratio(self) -> float | None:
        """max / median (None when the median is 0)."""
        return self.max_bytes / self.median_bytes if self.median_bytes > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {"over": self.over, "count": self.count, "max_bytes": self.max_bytes,
                "median_bytes": self.median_bytes, "ratio": self.ratio, "max_rank": self.max_rank,
                "max_path": self.max_path}


@dataclass(frozen=True)
class Worst:
    """The worst trace and the command that draws its single-trace report."""

    path: str
    rank: int | None
    why: str
    report_command: str

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rank": self.rank, "why": self.why, "report_command": self.report_command}


@dataclass(frozen=True)
class FleetSummary:
    """What the fleet's rows say together."""

    traces: int
    analyzed: int
    out_of_memory: int
    by_diagnosis: tuple[Group, ...]
    by_site: tuple[Group, ...]
    imbalance: Imbalance | None
    worst: Worst | None
    errors: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "traces": self.traces, "analyzed": self.analyzed, "failed_to_analyze": len(self.errors),
            "out_of_memory": self.out_of_memory,
            "by_diagnosis": [g.to_dict() for g in self.by_diagnosis],
            "by_site": [g.to_dict() for g in self.by_site],
            "imbalance": self.imbalance.to_dict() if self.imbalance else None,
            "worst": self.worst.to_dict() if self.worst else None,
            "errors": [{"path": p, "error": e} for p, e in self.errors],
        }

    def to_text(self) -> str:
        lines = [f"{self.traces} traces: {self.analyzed} analyzed, {len(self.errors)} could not be read, "
                 f"{self.out_of_memory} ran out of memory"]
        for title, groups in (("by diagnosis", self.by_diagnosis), ("by call-site", self.by_site)):
            if groups:
                lines.append(f"out of memory {title}:")
                lines.extend(f"  {g.traces:>5} x {site_text(g.key)}{_ranks(g.ranks)}"
                             for g in groups)
        if self.imbalance is not None:
            im = self.imbalance
            ratio = f"{im.ratio:.2f}x" if im.ratio is not None else "n/a"
            at = f"rank {im.max_rank}" if im.max_rank is not None else im.max_path
            lines.append(f"peak reserved across {im.count} {im.over}: max {format_size(im.max_bytes)} "
                         f"({at}), median {format_size(im.median_bytes)}, max/median {ratio}")
        if self.worst is not None:
            w = self.worst
            who = f"rank {w.rank}: " if w.rank is not None else ""
            lines.append(f"worst: {who}{w.path}: {w.why}")
            lines.append(f"  its report: {w.report_command}")
        lines.extend(f"error: {e}" for _, e in self.errors)
        return "\n".join(lines)


def _ranks(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return ""
    shown = ", ".join(map(str, ranks[:16])) + (", …" if len(ranks) > 16 else "")
    return f"  (rank {shown})"


def summarize(df: pl.DataFrame) -> FleetSummary:
    """The fleet summary from the fleet table (see the module docstring)."""
    ok = df.filter(pl.col("error").is_null())
    oom = ok.filter(pl.col("oom_seq").is_not_null())
    errors = df.filter(pl.col("error").is_not_null()).select("path", "error").rows()
    return FleetSummary(
        traces=df.height, analyzed=ok.height, out_of_memory=oom.height,
        by_diagnosis=_groups(oom, "oom_diagnosis"), by_site=_groups(oom, "oom_site"),
        imbalance=_imbalance(ok), worst=_worst(ok), errors=tuple((str(p), str(e)) for p, e in errors),
    )


def _groups(oom: pl.DataFrame, key: str) -> tuple[Group, ...]:
    g = (oom.lazy().group_by(key)
         .agg(pl.len().alias("n"), pl.col("rank").drop_nulls().sort().alias("ranks"),
              pl.col("path").alias("paths"))
         .sort(["n", key], descending=[True, False], nulls_last=True)
         .collect())
    return tuple(Group(r[key], r["n"], tuple(r["ranks"]), tuple(r["paths"])) for r in g.iter_rows(named=True))


def _imbalance(ok: pl.DataFrame) -> Imbalance | None:
    ranked = ok.filter(pl.col("rank").is_not_null())
    over, pool = ("ranks", ranked) if ranked.height else ("traces", ok)
    if pool.height == 0:
        return None
    top = pool.sort("peak_reserved_bytes", descending=True).row(0, named=True)
    median = pool.select(pl.col("peak_reserved_bytes").median()).item()
    return Imbalance(over, pool.height, int(top["peak_reserved_bytes"]), float(median), top["rank"],
                     top["path"])


def worst_paths(df: pl.DataFrame, k: int) -> list[str]:
    """The ``k`` worst analyzed traces: those that ran out of memory first, then by peak reserved."""
    ok = df.filter(pl.col("error").is_null())
    ranked = ok.sort([pl.col("oom_seq").is_not_null(), pl.col("peak_reserved_bytes")],
                     descending=[True, True], maintain_order=True)
    return ranked.get_column("path").head(k).to_list()


def _worst(ok: pl.DataFrame) -> Worst | None:
    paths = worst_paths(ok, 1)
    if not paths:
        return None
    r = ok.filter(pl.col("path") == paths[0]).row(0, named=True)
    if r["oom_seq"] is not None:
        why = (f"ran out of memory at seq {r['oom_seq']} asking {format_size(r['oom_size'])} at "
               f"{site_text(r['oom_site'])}: {r['oom_diagnosis']}")
    else:
        why = f"no OOM; the highest peak reserved, {format_size(r['peak_reserved_bytes'])}"
    out = Path(r["path"]).with_suffix(".html").name
    cmd = f"tracekit report {shlex.quote(r['path'])} -o {shlex.quote(out)}"
    return Worst(r["path"], r["rank"], why, cmd)
