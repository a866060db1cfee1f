"""``advise --verify-on-device N``: the top candidates re-checked through a real allocator on GPU N.

Each checked candidate's requests (the same counterfactual input the simulator replayed)
go through the device replay (``tracekit.device.replay.replay_on_device``) at the same
limit: CuPy's pool and a raised ``set_limit`` through a fresh CuPy ``MemoryPool``,
``MemoryAsyncPool`` through the async pool, plain ``cudaMalloc`` through cudaMalloc, and
PyTorch settings through PyTorch's own caching allocator when the device replay offers
one (``Allocator.TORCH``). A candidate is *confirmed* when the real allocator serves
every request, and a *disagreement* when model and reality differ on whether it fits.
Candidates the device replay cannot express (``free_all_blocks()`` inserted at a
call-site, free-list policies) are reported as not checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from tracekit.advise.candidates import Kind
from tracekit.advise.evaluate import Outcome
from tracekit.errors import DeviceError
from tracekit.trace.reader import Trace

TOP = 3
_CUPY = {Kind.CUPY_POOL: "CUPY", Kind.CUPY_LIMIT: "CUPY", Kind.CUPY_ASYNC: "CUPY_ASYNC",
         Kind.CUDA_MALLOC: "CUDA"}


@dataclass(frozen=True)
class DeviceCheck:
    """One candidate on the device: ``fits_on_device`` None when it could not be checked."""

    setting: str
    fits_in_model: bool
    fits_on_device: bool | None
    peak_reserved_on_device: int | None
    note: str = ""

    @property
    def agrees(self) -> bool | None:
        return None if self.fits_on_device is None else self.fits_on_device == self.fits_in_model

    def to_dict(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "agrees": self.agrees}


def verify(trace: Trace, tried: Sequence[Outcome], device: int, top: int = TOP) -> tuple[DeviceCheck, ...]:
    """Re-check the ``top`` best candidates (``tried`` ranked, best first) on ``device``."""
    from tracekit.device.capacity import Allocator
    from tracekit.device.replay import DeviceConfig, replay_on_device

    checks = []
    for o in tried[:top]:
        name = _CUPY.get(o.candidate.kind) if o.candidate.kind != Kind.TORCH_CONF else "TORCH"
        alloc = getattr(Allocator, name, None) if name else None
        if alloc is None:
            why = ("this device replay has no PyTorch allocator yet" if name == "TORCH"
                   else "the device replay cannot insert this change")
            checks.append(DeviceCheck(o.label(), o.fits, None, None, why))
            continue
        kw: dict[str, Any] = {"device": device, "allocator": alloc, "capacity": o.capacity}
        if o.candidate.options:
            if "torch_conf" not in {f.name for f in fields(DeviceConfig)}:
                why = "the device replay takes no allocator settings"
                checks.append(DeviceCheck(o.label(), o.fits, None, None, why))
                continue
            kw["torch_conf"] = dict(o.candidate.options)
        try:
            run = replay_on_device(_input(trace, o), DeviceConfig(**kw))
        except DeviceError as e:
            checks.append(DeviceCheck(o.label(), o.fits, None, None, str(e)))
            continue
        checks.append(DeviceCheck(o.label(), o.fits, run.ooms == 0, run.peak_reserved))
    return tuple(checks)


def _input(trace: Trace, o: Outcome) -> Trace:
    from tracekit.advise.counterfactual import prepare
    from tracekit.advise.evaluate import input_for

    return input_for(o.candidate, prepare(trace))
