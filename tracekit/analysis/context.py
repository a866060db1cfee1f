"""The device and limit facts an analysis needs, read defensively from trace metadata.

- ``device_total``: the CUDA total (``device.total_bytes``, else the budget's
  ``cuda_total``), i.e. board memory minus the driver's own reservation.
- ``free_at_start``: free device memory when recording began (``device.free_bytes``,
  else the budget's ``cuda_free``).
- ``overhead`` = device_total − free_at_start: what the driver, this process's
  CUDA context, other processes and any other reservation held before the
  first allocation.
- ``limit``: the binding allocator limit: ``pool_limit_bytes`` (CuPy's
  ``set_limit``, PyTorch's memory fraction × total); for a replay of a pool
  policy, its capacity.
- ``heap_capacity``: for a replay of a free-list policy, the heap it modelled
  (the whole simulated device, so it is not a limit).
- ``budget``: the numeric terms of the ``budget`` object the recorder stores (``Budget.terms``),
  any of which may be missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from tracekit.inputs import optional_int
from tracekit.trace.outcome import pool_limit_of
from tracekit.trace.recorded import truthy
from tracekit.trace.schema import Source, TraceMeta

# Budget keys that break the overhead down, in the words the explanation uses.
OVERHEAD_PARTS: tuple[tuple[str, str], ...] = (
    ("context_bytes", "this process's CUDA context"),
    ("other_processes_bytes", "other processes"),
)
# Estimated pieces of the context (the driver reports the context as one number).
CONTEXT_PARTS: tuple[tuple[str, str], ...] = (
    ("local_memory_model_bytes", "local memory for kernels (model)"),
    ("malloc_heap_size", "device malloc heap (limit)"),
    ("printf_fifo_size", "printf buffer"),
)


@dataclass(frozen=True)
class DeviceContext:
    """Facts about the device and limits at the start of a trace (bytes; None = unknown)."""

    device_name: str | None = None
    device_total: int | None = None
    free_at_start: int | None = None
    limit: int | None = None
    limit_what: str = "pool limit"
    budget: tuple[tuple[str, int], ...] = ()
    replay_policy: str | None = None
    heap_capacity: int | None = None
    expandable_segments: bool = False

    @property
    def overhead(self) -> int | None:
        """device_total − free_at_start (bytes held before the first allocation)."""
        if self.device_total is None or self.free_at_start is None:
            return None
        return self.device_total - self.free_at_start

    def overhead_parts(self) -> list[tuple[str, int]]:
        """Named parts of the overhead from the budget (context, other processes), largest first."""
        return _parts(self.budget, OVERHEAD_PARTS)

    def context_parts(self) -> list[tuple[str, int]]:
        """Estimated pieces of the context (local-memory model, malloc heap, printf buffer)."""
        return _parts(self.budget, CONTEXT_PARTS)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device_name": self.device_name,
            "device_total_bytes": self.device_total,
            "device_free_at_start_bytes": self.free_at_start,
            "overhead_bytes": self.overhead,
            "limit_bytes": self.limit,
            "limit_kind": self.limit_what if self.limit is not None else None,
            "budget": dict(self.budget) or None,
        }


def _parts(budget: tuple[tuple[str, int], ...], names: tuple[tuple[str, str], ...]) -> list[tuple[str, int]]:
    b = dict(budget)
    return sorted(((label, b[key]) for key, label in names if b.get(key)), key=lambda p: -p[1])


def expandable(meta: TraceMeta) -> bool:
    """PyTorch expandable segments: adjacent segment rows are pieces of one virtual segment."""
    if meta.recorded.torch_settings.expandable_segments:
        return True
    options = meta.extra.get("options")
    return isinstance(options, Mapping) and truthy(options.get("expandable_segments"))


def _replay_context(meta: TraceMeta) -> DeviceContext:
    """A replay models its own device: ``capacity`` is the heap (free lists) or the
    pool limit (pools), ``device_total`` the simulated device (None = unbounded,
    with nothing taken before the first allocation)."""
    extra = meta.extra
    policy = extra.get("policy")
    policy = str(policy) if policy is not None else None
    capacity = optional_int(extra.get("capacity"))
    if capacity is None:
        capacity = meta.pool_limit_bytes
    total = optional_int(extra.get("device_total"))
    name = meta.device.name if meta.device else None
    from tracekit.sim import policies as registry

    if policy is not None and registry.is_heap(policy):  # the replay modelled the device as one heap
        return DeviceContext(device_name=name, replay_policy=policy, heap_capacity=capacity)
    return DeviceContext(
        device_name=name, device_total=total, free_at_start=total,
        limit=capacity if capacity and capacity > 0 else None,
        limit_what=f"{policy or 'replay'} capacity", replay_policy=policy,
        expandable_segments=expandable(meta),
    )


def device_context(meta: TraceMeta) -> DeviceContext:
    """Collect what the metadata says; anything malformed is treated as unknown."""
    if meta.source == Source.REPLAY:
        return _replay_context(meta)
    budget = meta.recorded.budget.terms
    b = dict(budget)
    dev = meta.device
    total = optional_int(dev.total_bytes) if dev else None
    free = optional_int(dev.free_bytes) if dev else None
    total = total if total is not None else b.get("cuda_total")
    free = free if free is not None else b.get("cuda_free")
    limit = meta.pool_limit_bytes
    if limit is not None and limit <= 0:  # CuPy: 0 means no limit
        limit = None
    return DeviceContext(
        device_name=dev.name if dev else None, device_total=total, free_at_start=free,
        limit=limit, budget=budget, expandable_segments=expandable(meta),
    )


def device_context_for(meta: TraceMeta, device: int, home: bool) -> DeviceContext:
    """The context of one device of a trace: the start metadata (device total, free at start,
    budget, ``pool_limit_bytes``) describes the ``home`` device only; the ``pools`` entry of
    ``device`` with the lowest id (its default pool) gives that device's pool limit."""
    ctx = device_context(meta)
    if ctx.replay_policy is not None:
        return ctx
    limit = pool_limit_of(meta, device, home)
    if home:
        return replace(ctx, limit=limit)
    return DeviceContext(limit=limit, expandable_segments=ctx.expandable_segments)
