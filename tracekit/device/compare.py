"""``--compare-sim POLICY``: the same trace and capacity through the simulator, next to the device.

Compared figures: the input seq of the first OOM (None = no OOM), peak reserved
bytes, segment allocations and frees, and peak live bytes. ``agree`` is true
when the first OOM seq and the segment counts match exactly and peak reserved
matches within ``reserved_tolerance`` bytes (0 for the ``cupy`` allocator,
whose device allocations are observed one by one; the cuda allocator's peak is
sampled, so it is compared loosely and marked as such).
"""

from __future__ import annotations

from typing import Any

from tracekit.errors import UsageError
from tracekit.trace.reader import Trace

ROWS = ("first_oom_seq", "peak_reserved_bytes", "segment_allocs", "segment_frees", "peak_live_bytes")
DECIDING = ("first_oom_seq", "peak_reserved_bytes", "segment_allocs", "segment_frees")


def check_policy(policy: str) -> None:
    """UsageError for an unknown policy, before any device work starts."""
    from tracekit.sim import policies

    names = policies.models()
    if policy not in names:
        raise UsageError(f"unknown policy {policy!r} for --compare-sim; choose one of: {', '.join(names)}")


def compare_with_sim(trace: Trace, policy: str, capacity: int | None, continue_on_oom: bool,
                     device: dict[str, Any]) -> dict[str, Any]:
    """Simulate ``policy`` and compare it with the device replay's summary ``device``."""
    from tracekit.sim.base import SimConfig
    from tracekit.sim.engine import replay

    sim = replay(trace, policy, SimConfig(capacity=capacity, continue_on_oom=continue_on_oom)).to_dict()
    return compare_summaries(device, sim, policy)


def _first_oom(s: dict[str, Any]) -> int | None:
    return None if s.get("oom") is None else int(s["oom"]["seq"])


def compare_summaries(device: dict[str, Any], sim: dict[str, Any], policy: str) -> dict[str, Any]:
    """Row by row: device value, simulated value, equal or not; plus the overall verdict."""
    tol = 0 if device.get("allocator") == "cupy" else None
    rows = []
    for key in ROWS:
        d = _first_oom(device) if key == "first_oom_seq" else device.get(key)
        s = _first_oom(sim) if key == "first_oom_seq" else sim.get(key)
        # peak reserved is exact only for the observed cupy pool (cuda: sampled; async: driver pool)
        same = None if key == "peak_reserved_bytes" and tol is None else d == s
        rows.append({"figure": key, "device": d, "sim": s, "agree": same})
    decided = [r["agree"] for r in rows if r["figure"] in DECIDING and r["agree"] is not None]
    return {"policy": policy, "allocator": device.get("allocator"), "rows": rows, "agree": all(decided)}


def format_comparison(c: dict[str, Any]) -> str:
    """A small side-by-side table."""
    lines = [f"{'':22} {'device (' + str(c['allocator']) + ')':>22} {'sim (' + c['policy'] + ')':>22}  agree"]
    for r in c["rows"]:
        a = "n/a" if r["agree"] is None else ("yes" if r["agree"] else "NO")
        lines.append(f"{r['figure']:22} {_fmt(r['device']):>22} {_fmt(r['sim']):>22}  {a}")
    lines.append("device and simulator " + ("agree" if c["agree"] else "DISAGREE"))
    return "\n".join(lines)


def _fmt(v: Any) -> str:
    return "none" if v is None else f"{v:,}" if isinstance(v, int) else str(v)
