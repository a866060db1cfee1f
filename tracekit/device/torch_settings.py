"""What PyTorch's allocator is told before a device replay: its settings string and its limit.

``plan_settings`` merges the settings a trace was recorded under (an imported
snapshot's ``allocator_settings``) with the ones given (``--torch-conf``, PyTorch's
``key:value,...`` syntax), checks them as the ``torch`` model does, and writes
the one string handed to ``torch.cuda.memory._set_allocator_settings``. That
call resets ``max_split_size_mb``, ``roundup_power2_divisions`` and
``garbage_collection_threshold`` to their defaults before parsing but keeps
``expandable_segments`` and ``max_non_split_rounding_mb`` from earlier calls, so
the string always names both. tracekit's own keys (``release_points``,
``addresses``) steer the replay and the model and never reach PyTorch.
``fraction_for`` finds the ``set_per_process_memory_fraction`` value whose
limit, ``(size_t)(fraction x total)`` as PyTorch computes it, is exactly the
capacity in bytes. No PyTorch is imported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracekit.errors import DeviceError, UsageError
from tracekit.sim.torch_rules import (
    TorchSettings,
    options_from_snapshot,
    settings,
)

# Keys that change where device memory goes; every other PyTorch key is left at its default.
_SHAPING = ("max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions",
            "garbage_collection_threshold")
_OWN = ("release_points", "addresses")  # tracekit's options, for the replay and the model only
DEFAULT_NON_SPLIT_MB = 20  # PyTorch's kLargeBuffer, the default max_non_split_rounding


@dataclass(frozen=True)
class SettingsPlan:
    """The string for ``_set_allocator_settings``, what it must produce, and tracekit's options.

    ``options`` are the merged ``key -> value`` options (model syntax), which
    the comparison with the model reuses; ``release_points``: call
    ``empty_cache()`` where the trace shows the program releasing memory.
    """

    conf: str
    expected: TorchSettings
    options: Mapping[str, str]
    release_points: bool


def plan_settings(recorded: Mapping[str, Any] | None, given: Mapping[str, str]) -> SettingsPlan:
    """Recorded settings overridden key by key by ``given``; UsageError names a bad key or value."""
    options = {**options_from_snapshot(recorded or {}), **given}
    expected = settings(options)  # validates every key and value, as --sim torch does
    parts = [f"expandable_segments:{expected.expandable_segments}"]
    non_split = options.get("max_non_split_rounding_mb", DEFAULT_NON_SPLIT_MB)
    parts.append(f"max_non_split_rounding_mb:{non_split}")
    parts += [f"{k}:{options[k]}" for k in _SHAPING if k in options and k != "max_non_split_rounding_mb"]
    if expected.expandable_segments and expected.max_split_size < (1 << 62):
        raise UsageError("--torch-conf: PyTorch does not support max_split_size_mb together with "
                         "expandable_segments:True")
    return SettingsPlan(",".join(parts), expected, options, expected.release_at_trace_frees)


def check_applied(plan: SettingsPlan, reported: Any) -> None:
    """DeviceError unless PyTorch's own report of its settings (a snapshot's
    ``allocator_settings``) matches the plan; nothing to check when it reports none."""
    if not isinstance(reported, Mapping):
        return
    got = settings(options_from_snapshot(reported))
    want = plan.expected
    for name in ("max_split_size", "roundup_power2_divisions", "expandable_segments",
                 "garbage_collection_threshold"):
        if getattr(got, name) != getattr(want, name):
            raise DeviceError(
                f"PyTorch's allocator did not take the settings {plan.conf!r}: its {name} is "
                f"{getattr(got, name)!r}, expected {getattr(want, name)!r}"
            )


def fraction_for(capacity: int, total: int) -> float:
    """The float f with ``int(f * total) == capacity`` (PyTorch: ``(size_t)(f * (double)total)``).

    f = capacity / total, then moved by one ulp at a time until the truncated
    product is exact; UsageError when the capacity exceeds the device's total.
    """
    if not 0 < capacity <= total:
        raise UsageError(f"--capacity {capacity} bytes is not within the device's {total} bytes")
    f = capacity / total
    for _ in range(64):
        got = int(f * total)
        if got == capacity:
            return f
        f = math.nextafter(f, 2.0 if got < capacity else 0.0)
    raise DeviceError(f"no memory fraction gives a limit of exactly {capacity} bytes "
                      f"on a {total}-byte device")

