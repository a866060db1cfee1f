"""What one test measured, per device: plain data that travels in a report's ``user_properties``
(pytest-xdist serializes it from the worker to the controller)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

METRICS = ("reserved", "allocated", "device")


@dataclass(frozen=True)
class DevicePeak:
    """Peaks of one device during a test's call (bytes); ``device_used``: cudaMemGetInfo's used
    bytes at the lowest free measured (None where not measured); ``leaked``: block bytes the test
    left live; ``peak_index``: the row of the allocated peak (CuPy; -1 none)."""

    device: int
    allocated: int
    reserved: int
    device_used: int | None = None
    device_total: int | None = None
    leaked: int = 0
    peak_index: int = -1

    def metric(self, name: str) -> int | None:
        return {"reserved": self.reserved, "allocated": self.allocated, "device": self.device_used}[name]


class Backend(StrEnum):
    """The allocator a meter measures (its value is the one the JSON of a measurement carries)."""

    CUPY = "cupy"
    TORCH = "torch"


@dataclass(frozen=True)
class Measurement:
    backend: Backend
    devices: dict[int, DevicePeak] = field(default_factory=dict)
    events: int = 0

    def peak(self, metric: str) -> tuple[int, int | None]:
        """(device, the highest ``metric`` over the devices)."""
        best: tuple[int, int | None] = (0, None)
        for d, p in sorted(self.devices.items()):
            v = p.metric(metric)
            if v is not None and (best[1] is None or v > best[1]):
                best = (d, v)
        return best

    def leaked(self) -> int:
        return sum(p.leaked for p in self.devices.values())

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend.value, "events": self.events,
                "devices": [dataclasses.asdict(p) for p in self.devices.values()]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Measurement:
        peaks = {int(p["device"]): DevicePeak(**p) for p in d.get("devices", [])}
        return cls(backend=Backend(str(d.get("backend"))), devices=peaks, events=int(d.get("events") or 0))
