"""``--compare-sim POLICY``: the same trace and capacity through the simulator, next to the device.

Compared figures: the input seq of the first OOM (None = no OOM), peak reserved
bytes, segment allocations and frees, and peak live bytes. ``agree`` is true
when the first OOM seq and the segment counts match exactly and peak reserved
matches exactly for the ``cupy`` and ``torch`` allocators, whose device
allocations are observed one by one (the cuda allocator's peak is sampled, so
it is shown but not decisive). ``reserved_by_request`` and
``compare_reserved`` compare reserved bytes after every request (the torch
allocator's rows come from its own history; ``tracekit.device.torch_compare``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NotRequired, TypedDict

import numpy as np

from tracekit.device.figures import DeviceFigures, TorchFigures
from tracekit.errors import UsageError
from tracekit.sim import policies
from tracekit.sim.base import Allocator
from tracekit.sim.result import ReplaySummary
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

ROWS = ("first_oom_seq", "peak_reserved_bytes", "segment_allocs", "segment_frees", "peak_live_bytes")
DECIDING = ("first_oom_seq", "peak_reserved_bytes", "segment_allocs", "segment_frees")


class FigureRowDict(TypedDict):
    figure: str
    device: int | None
    sim: int | None
    agree: bool | None


class ReservedComparisonDict(TypedDict):
    model: str
    requests: int
    same: int
    first_index: int | None
    first_seq: int | None
    device_reserved: int | None
    model_reserved: int | None


class SimComparisonDict(TypedDict):
    """``compare_sim`` in ``replay --device N --compare-sim POLICY --json``."""

    policy: str
    allocator: str | None
    rows: list[FigureRowDict]
    agree: bool
    reserved: NotRequired[list[ReservedComparisonDict]]


def check_policy(policy: str) -> None:
    """UsageError for an unknown policy, before any device work starts."""
    names = policies.models()
    if policy not in names:
        raise UsageError(f"unknown policy {policy!r} for --compare-sim; choose one of: {', '.join(names)}")


@dataclass(frozen=True)
class FigureRow:
    """One compared figure: the device's value, the simulator's, and whether they agree (None:
    shown, not decisive)."""

    figure: str
    device: int | None
    sim: int | None
    agree: bool | None

    def to_dict(self) -> FigureRowDict:
        return FigureRowDict(figure=self.figure, device=self.device, sim=self.sim, agree=self.agree)


@dataclass(frozen=True)
class ReservedComparison:
    """Reserved bytes after every replayed request, device against model.

    ``requests``: requests compared; ``same``: how many agree to the byte;
    ``first_index``: input index of the first that differs (None: none), with its
    ``first_seq`` and both values (bytes).
    """

    model: str
    requests: int
    same: int
    first_index: int | None
    first_seq: int | None
    device_reserved: int | None
    model_reserved: int | None

    def to_dict(self) -> ReservedComparisonDict:
        return ReservedComparisonDict(
            model=self.model, requests=self.requests, same=self.same, first_index=self.first_index,
            first_seq=self.first_seq, device_reserved=self.device_reserved,
            model_reserved=self.model_reserved)


@dataclass(frozen=True)
class SimComparison:
    """The device replay against the simulator: figure rows and, for torch against torch, reserved
    bytes request by request (``reserved`` None: not compared). ``agree``: every deciding row
    that is decisive agrees, and reserved bytes agree after every request."""

    policy: str
    allocator: str | None  # the device's allocator (None: the summary has no device group)
    rows: tuple[FigureRow, ...]
    reserved: tuple[ReservedComparison, ...] | None = None

    @property
    def agree(self) -> bool:
        decided = all(r.agree for r in self.rows if r.figure in DECIDING and r.agree is not None)
        return decided and all(c.first_index is None for c in self.reserved or ())

    def to_dict(self) -> SimComparisonDict:
        d = SimComparisonDict(policy=self.policy, allocator=self.allocator,
                              rows=[r.to_dict() for r in self.rows], agree=self.agree)
        if self.reserved is not None:
            d["reserved"] = [c.to_dict() for c in self.reserved]
        return d


def compare_with_sim(trace: Trace, policy: str, capacity: int | None, continue_on_oom: bool,
                     device: ReplaySummary, options: Mapping[str, str] | None = None,
                     stop_at_first_oom: bool = False) -> SimComparison:
    """Simulate ``policy`` and compare it with the device replay's summary ``device``.

    ``options``: the torch allocator settings the device ran under (given to the ``torch`` model only);
    the model replays the recording as the device did (as recorded, handled OOMs gone past unless
    ``stop_at_first_oom``).
    """
    from tracekit.sim.base import SimConfig
    from tracekit.sim.engine import replay

    opts = dict(options or {}) if policies.allocator_of(policy) == Allocator.TORCH else {}
    sim = replay(trace, policy, SimConfig(capacity=capacity, continue_on_oom=continue_on_oom,
                                          options=opts, stop_at_first_oom=stop_at_first_oom)).summary
    return compare_summaries(device, sim, policy)


def _figure(s: ReplaySummary, key: str) -> int | None:
    """A compared figure of a summary: ``first_oom_seq`` is the first OOM's seq (None: no OOM)."""
    if key == "first_oom_seq":
        return None if s.oom is None else s.oom.seq
    value: int | None = getattr(s, key)
    return value


def compare_summaries(device: ReplaySummary, sim: ReplaySummary, policy: str) -> SimComparison:
    """Row by row: device value, simulated value, equal or not; ``agree`` is the overall verdict."""
    dev = device.group("device")
    dev = dev if isinstance(dev, DeviceFigures) else None
    torch = device.group("torch")
    exact = dev is not None and dev.peak_reserved == "exact"
    # expandable segments: the device's rows are 2 MiB pages, the model's 2 or 20 MiB pages
    pages = isinstance(torch, TorchFigures) and torch.expandable_segments
    rows = []
    for key in ROWS:
        d, s = _figure(device, key), _figure(sim, key)
        # peak reserved is exact only for observed pools (cuda: sampled; async: driver pool)
        # torch: the device counts live bytes as requests rounded to 512 B, the model as PyTorch's blocks
        loose = (key == "peak_reserved_bytes" and not exact) or (key.startswith("segment_") and pages) \
            or (key == "peak_live_bytes" and dev is not None and dev.allocator == Allocator.TORCH)
        rows.append(FigureRow(key, d, s, None if loose else d == s))
    return SimComparison(policy, dev.allocator if dev is not None else None, tuple(rows))


def format_comparison(c: SimComparison) -> str:
    """A small side-by-side table."""
    lines = [f"{'':22} {'device (' + str(c.allocator) + ')':>22} {'sim (' + c.policy + ')':>22}  agree"]
    for r in c.rows:
        a = "n/a" if r.agree is None else ("yes" if r.agree else "NO")
        lines.append(f"{r.figure:22} {_fmt(r.device):>22} {_fmt(r.sim):>22}  {a}")
    lines += [format_reserved(r) for r in c.reserved or ()]
    lines.append("device and simulator " + ("agree" if c.agree else "DISAGREE"))
    return "\n".join(lines)


def _fmt(v: int | None) -> str:
    return "none" if v is None else f"{v:,}"


def reserved_by_request(n: int, before: np.ndarray, op: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Reserved bytes after each of ``n`` events from allocator rows inserted before event indices.

    reserved[i] = sum over rows with before <= i of (+size for segment_alloc, -size for segment_free).
    """
    delta = np.zeros(n + 1, np.int64)
    sign = np.where(np.asarray(op) == Op.SEGMENT_ALLOC, 1, -1)
    np.add.at(delta, np.minimum(np.asarray(before, np.int64), n), sign * np.asarray(size, np.int64))
    return np.cumsum(delta)[:n]


def compare_reserved(trace: Trace, requests: np.ndarray, device: np.ndarray, model: np.ndarray,
                     label: str) -> ReservedComparison:
    """Compare ``device`` and ``model`` reserved bytes (length n) at the input indices ``requests``."""
    miss = requests[device[requests] != model[requests]]
    if len(miss) == 0:
        return ReservedComparison(label, len(requests), len(requests), None, None, None, None)
    i = int(miss[0])
    return ReservedComparison(label, len(requests), len(requests) - len(miss), i, int(trace.events.seq[i]),
                              int(device[i]), int(model[i]))


def format_reserved(c: ReservedComparison) -> str:
    """One line: agreement, or the first request where reserved bytes differ."""
    if c.first_index is None:
        return f"reserved bytes ({c.model}): the same after all {c.requests:,} requests"
    return (f"reserved bytes ({c.model}): first differ at seq {c.first_seq} (input row {c.first_index}): "
            f"device {c.device_reserved:,}, model {c.model_reserved:,}; {c.same:,} of {c.requests:,} "
            "requests agree")
