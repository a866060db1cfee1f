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
from typing import Any

import numpy as np

from tracekit.errors import UsageError
from tracekit.sim import policies
from tracekit.sim.base import Allocator
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op

ROWS = ("first_oom_seq", "peak_reserved_bytes", "segment_allocs", "segment_frees", "peak_live_bytes")
DECIDING = ("first_oom_seq", "peak_reserved_bytes", "segment_allocs", "segment_frees")


def check_policy(policy: str) -> None:
    """UsageError for an unknown policy, before any device work starts."""
    from tracekit.sim import policies

    names = policies.models()
    if policy not in names:
        raise UsageError(f"unknown policy {policy!r} for --compare-sim; choose one of: {', '.join(names)}")


def compare_with_sim(trace: Trace, policy: str, capacity: int | None, continue_on_oom: bool,
                     device: dict[str, Any], options: Mapping[str, str] | None = None,
                     stop_at_first_oom: bool = False) -> dict[str, Any]:
    """Simulate ``policy`` and compare it with the device replay's summary ``device``.

    ``options``: the torch allocator settings the device ran under (given to the ``torch`` model only);
    the model replays the recording as the device did (as recorded, handled OOMs gone past unless
    ``stop_at_first_oom``).
    """
    from tracekit.sim.base import SimConfig
    from tracekit.sim.engine import replay

    opts = dict(options or {}) if policies.allocator_of(policy) == Allocator.TORCH else {}
    sim = replay(trace, policy, SimConfig(capacity=capacity, continue_on_oom=continue_on_oom,
                                          options=opts, stop_at_first_oom=stop_at_first_oom)).to_dict()
    return compare_summaries(device, sim, policy)


def _first_oom(s: dict[str, Any]) -> int | None:
    return None if s.get("oom") is None else int(s["oom"]["seq"])


def compare_summaries(device: dict[str, Any], sim: dict[str, Any], policy: str) -> dict[str, Any]:
    """Row by row: device value, simulated value, equal or not; plus the overall verdict."""
    dev = device.get("device") or {}
    exact = dev.get("peak_reserved") == "exact"
    # expandable segments: the device's rows are 2 MiB pages, the model's 2 or 20 MiB pages
    pages = bool((device.get("torch") or {}).get("expandable_segments"))
    rows = []
    for key in ROWS:
        d = _first_oom(device) if key == "first_oom_seq" else device.get(key)
        s = _first_oom(sim) if key == "first_oom_seq" else sim.get(key)
        # peak reserved is exact only for observed pools (cuda: sampled; async: driver pool)
        # torch: the device counts live bytes as requests rounded to 512 B, the model as PyTorch's blocks
        loose = (key == "peak_reserved_bytes" and not exact) or (key.startswith("segment_") and pages) \
            or (key == "peak_live_bytes" and dev.get("allocator") == Allocator.TORCH)
        same = None if loose else d == s
        rows.append({"figure": key, "device": d, "sim": s, "agree": same})
    decided = [r["agree"] for r in rows if r["figure"] in DECIDING and r["agree"] is not None]
    return {"policy": policy, "allocator": dev.get("allocator"), "rows": rows, "agree": all(decided)}


def format_comparison(c: dict[str, Any]) -> str:
    """A small side-by-side table."""
    lines = [f"{'':22} {'device (' + str(c['allocator']) + ')':>22} {'sim (' + c['policy'] + ')':>22}  agree"]
    for r in c["rows"]:
        a = "n/a" if r["agree"] is None else ("yes" if r["agree"] else "NO")
        lines.append(f"{r['figure']:22} {_fmt(r['device']):>22} {_fmt(r['sim']):>22}  {a}")
    for r in c.get("reserved", []):
        lines.append(format_reserved(ReservedComparison(
            r["model"], r["requests"], r["same"], -1 if r["first_index"] is None else r["first_index"],
            r["first_seq"], r["device_reserved"], r["model_reserved"])))
    lines.append("device and simulator " + ("agree" if c["agree"] else "DISAGREE"))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return "none" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


def reserved_by_request(n: int, before: np.ndarray, op: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Reserved bytes after each of ``n`` events from allocator rows inserted before event indices.

    reserved[i] = sum over rows with before <= i of (+size for segment_alloc, -size for segment_free).
    """
    delta = np.zeros(n + 1, np.int64)
    sign = np.where(np.asarray(op) == Op.SEGMENT_ALLOC, 1, -1)
    np.add.at(delta, np.minimum(np.asarray(before, np.int64), n), sign * np.asarray(size, np.int64))
    return np.cumsum(delta)[:n]


@dataclass(frozen=True)
class ReservedComparison:
    """Reserved bytes after every replayed request, device against model.

    ``requests``: requests compared; ``same``: how many agree to the byte;
    ``first``: input index of the first that differs (-1 none), with its
    ``seq`` and both values (bytes).
    """

    model: str
    requests: int
    same: int
    first: int
    seq: int | None
    device_bytes: int | None
    model_bytes: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "requests": self.requests, "same": self.same,
                "first_index": None if self.first < 0 else self.first, "first_seq": self.seq,
                "device_reserved": self.device_bytes, "model_reserved": self.model_bytes}


def compare_reserved(trace: Trace, requests: np.ndarray, device: np.ndarray, model: np.ndarray,
                     label: str) -> ReservedComparison:
    """Compare ``device`` and ``model`` reserved bytes (length n) at the input indices ``requests``."""
    miss = requests[device[requests] != model[requests]]
    if len(miss) == 0:
        return ReservedComparison(label, len(requests), len(requests), -1, None, None, None)
    i = int(miss[0])
    return ReservedComparison(label, len(requests), len(requests) - len(miss), i, int(trace.events.seq[i]),
                              int(device[i]), int(model[i]))


def format_reserved(c: ReservedComparison) -> str:
    """One line: agreement, or the first request where reserved bytes differ."""
    if c.first < 0:
        return f"reserved bytes ({c.model}): the same after all {c.requests:,} requests"
    return (f"reserved bytes ({c.model}): first differ at seq {c.seq} (input row {c.first}): device "
            f"{c.device_bytes:,}, model {c.model_bytes:,}; {c.same:,} of {c.requests:,} requests agree")
