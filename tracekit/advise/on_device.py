"""``advise --verify-on-device N``: the top candidates re-checked through a real allocator on GPU N.

Each checked candidate's requests (the same counterfactual input the simulator replayed)
go through a device replay at the same limit: PyTorch settings through PyTorch's own
caching allocator (``tracekit.device.torch_replay.replay_torch_on_device``), CuPy's pool
and a raised ``set_limit`` through a fresh CuPy ``MemoryPool``, ``MemoryAsyncPool``
through the async pool and plain ``cudaMalloc`` through cudaMalloc
(``tracekit.device.replay.replay_on_device``). A candidate is *confirmed* when the real allocator serves
every request, and a *disagreement* when model and reality differ on whether it fits.
An overhead cure is replayed as the recorded setting in the room the cure gives back.
Candidates the device replay cannot express (``free_all_blocks()`` inserted at a
call-site, free-list policies) are reported as not checked; when no candidate could be
replayed at all (no GPU, no CuPy or PyTorch) that is a DeviceError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from tracekit.advise.candidates import Kind
from tracekit.advise.evaluate import Outcome
from tracekit.errors import DeviceError
from tracekit.sim import policies
from tracekit.sim.base import Allocator
from tracekit.trace.reader import Trace

TOP = 3
# The settings the device loop runs as they are, on the real allocator their policy models (asked of
# the registry); free_all_blocks() at a call-site, say, has no device loop. RMM's pool runs on RMM's own
# PoolMemoryResource (where RMM is installed); its CudaAsyncMemoryResource and CudaMemoryResource on
# the driver's allocators they call (cudaMallocAsync, cudaMalloc), as their policies model them.
AS_THEY_ARE = frozenset({Kind.CUPY_POOL, Kind.CUPY_LIMIT, Kind.CUPY_ASYNC, Kind.CUDA_MALLOC,
                         Kind.RMM_POOL, Kind.RMM_ASYNC, Kind.RMM_CUDA})


class DeviceCheckDict(TypedDict):
    """One entry of ``device_checks`` in ``advise --json``: the fields and the derived ``agrees``."""

    setting: str
    fits_in_model: bool
    fits_on_device: bool | None
    peak_reserved_on_device: int | None
    note: str
    agrees: bool | None


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

    def to_dict(self) -> DeviceCheckDict:
        return DeviceCheckDict(setting=self.setting, fits_in_model=self.fits_in_model,
                               fits_on_device=self.fits_on_device,
                               peak_reserved_on_device=self.peak_reserved_on_device, note=self.note,
                               agrees=self.agrees)


def verify(trace: Trace, tried: Sequence[Outcome], device: int, top: int = TOP) -> tuple[DeviceCheck, ...]:
    """Re-check the ``top`` best candidates (``tried`` ranked, best first) on ``device``."""
    checks = []
    errors: list[Exception] = []
    for o in tried[:top]:
        try:
            run = _replay(trace, o, device)
        except (DeviceError, ImportError) as e:  # this candidate is not claimed either way
            errors.append(e)
            checks.append(DeviceCheck(o.label(), o.fits, None, None, str(e)))
            continue
        if run is None:
            why = "the device replay cannot insert this change"
            checks.append(DeviceCheck(o.label(), o.fits, None, None, why))
            continue
        checks.append(DeviceCheck(o.label(), o.fits, run.ooms == 0, run.peak_reserved))
    if errors and all(c.fits_on_device is None for c in checks):
        raise DeviceError(f"--verify-on-device {device}: no setting could be replayed on the device "
                          f"({errors[0]})")
    return tuple(checks)


def _replay(trace: Trace, o: Outcome, device: int) -> Any:
    """The device run of candidate ``o`` (None when the device replay cannot express it).

    An overhead cure is checked as the recorded setting in the room the cure gives back
    (the capacity is emulated by holding the rest of the device): the allocator's part of
    the claim; what the cure itself gives back is measured by ``scripts/seed_scenario.py``.
    """
    models = policies.allocator_of(o.candidate.policy) if o.candidate.policy is not None else None
    if (o.candidate.cures and models == Allocator.TORCH) or o.candidate.kind == Kind.TORCH_CONF:
        from tracekit.device.torch_replay import replay_torch_on_device

        return replay_torch_on_device(_input(trace, o), dict(o.candidate.options), o.capacity, device)
    if models is None or not (o.candidate.cures or o.candidate.kind in AS_THEY_ARE):
        return None
    if o.candidate.cures and models != Allocator.CUPY:
        return None
    from tracekit.device.replay import DeviceConfig, replay_on_device

    cfg = DeviceConfig(device=device, allocator=models, capacity=o.capacity, options=o.candidate.opts)
    return replay_on_device(_input(trace, o), cfg)


def _input(trace: Trace, o: Outcome) -> Trace:
    from tracekit.advise.counterfactual import prepare
    from tracekit.advise.evaluate import input_for

    return input_for(o.candidate, prepare(trace))
