"""What the figures read from the analyzer's summary and the what-if result (``report --png``, ``fleet``).

``shown_devices`` picks the devices of a trace of several that get figures; ``load_whatif`` reads and
checks saved ``tracekit whatif --json`` output (the page takes it as a ``WhatIfResult``);
``whatif_rows`` is the what-if figure's rows (from a ``WhatIfResult``). The report's text is the page
(``tracekit.report.page``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracekit.errors import InputError
from tracekit.inputs import load_json_file
from tracekit.report.html import fmt_value

if TYPE_CHECKING:
    from tracekit.advise.capacity import WhatIfResult
    from tracekit.analysis.summary import Summary

# Devices drawn and tabled one by one; a trace of more (the format allows 32,768) shows these and
# says how many more there are, so the report's time and size do not grow with the device count.
MAX_SHOWN_DEVICES = 8


def shown_devices(summary: Summary) -> list[Summary]:
    """The per-device summaries a report shows, at most ``MAX_SHOWN_DEVICES``: the reported
    device first, then those with an OOM (the first OOM first), then the highest peak reserved."""

    def rank(p: Summary) -> tuple[bool, bool, int]:
        return (p.device != summary.device, p.oom is None,
                p.oom.seq if p.oom is not None else -p.peak_reserved_bytes)

    chosen = sorted(summary.devices, key=rank)[:MAX_SHOWN_DEVICES]
    return sorted(chosen, key=lambda p: p.device or 0)


def load_whatif(whatif: Any) -> dict[str, Any]:
    """A what-if result as a dict: an object with ``to_dict()``, a dict, or a path to its JSON.

    A file that is not ``tracekit whatif --json`` output raises InputError naming it and the cause.
    """
    if hasattr(whatif, "to_dict"):
        return dict(whatif.to_dict())
    if isinstance(whatif, dict):
        return whatif
    path = Path(whatif)
    d = load_json_file(path, "what-if JSON")  # the input policy: regular file, bounded size and depth
    if not isinstance(d, dict):
        raise InputError(
            f"{path}: expected the JSON object `tracekit whatif --json` prints, found a {type(d).__name__}"
        )
    if "policies" not in d and "devices" not in d:
        raise InputError(f"{path}: holds no what-if result (no 'policies'), as `tracekit whatif --json` "
                         "prints")
    pol = d.get("policies", [])
    if not isinstance(pol, list) or not all(isinstance(r, dict) for r in pol):
        raise InputError(f"{path}: 'policies' must be a list of objects, as `tracekit whatif --json` prints")
    numbers = [("lower_bound_bytes", d.get("lower_bound_bytes"))]
    numbers += [(f"policies[{i}].{k}", r.get(k)) for i, r in enumerate(pol)
                for k in ("min_capacity_bytes", "capacity_bytes", "overhead_ratio", "overhead",
                          "searched_up_to_bytes")]
    for key, v in numbers:
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not -2**62 < v < 2**62):
            raise InputError(
                f"{path}: '{key}' must be a number below 2^62 or null, found {json.dumps(v)[:40]}")
    return d


@dataclass(frozen=True)
class WhatIfRow:
    """One bar of the what-if figure: the policy (``device N: POLICY`` for a trace of several devices),
    its smallest capacity without OOM (None: none found), the overhead over the lower bound (a ratio) and
    why there is no capacity."""

    policy: str
    capacity_bytes: int | None
    overhead: float | None
    note: str


def whatif_rows(w: WhatIfResult) -> list[WhatIfRow]:
    """The what-if figure's rows from the search's result: every policy, every device's for a result of
    several devices."""
    parts = w.devices or (w,)
    rows = []
    for p in parts:
        prefix = f"device {p.device}: " if w.devices else ""
        for f in p.fits:
            note = f.error or (f"no fit up to {fmt_value('bytes', f.searched_up_to)}"
                               if f.min_capacity is None and f.searched_up_to else "")
            rows.append(WhatIfRow(prefix + f.policy, f.min_capacity, f.overhead_ratio, note))
    return rows
