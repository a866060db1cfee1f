"""The JSON shapes of the device budget: what ``budget --json`` prints and a recording stores.

``CheapBudget`` is ``cheap_budget``'s dict (one key per ``measure.BUDGET_KEYS`` entry, bytes
unless named otherwise, ``None`` where the driver would not say); ``Budget`` adds the optional
sections of the full budget: ``probe`` (the largest single cudaMalloc and the device's
granularity), ``kernel_local`` (one kernel's local-memory cost) and ``final`` (cudaMemGetInfo and
the pool after the probes).
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class OtherProcess(TypedDict):
    """A process NVML lists on the device; ``bytes`` None where NVML hides it."""

    pid: int
    bytes: int | None


class PoolFigures(TypedDict):
    """CuPy's default pool in this process (None: CuPy's pool not in use)."""

    cupy_pool_total_bytes: int | None
    cupy_pool_used_bytes: int | None


class CheapBudget(PoolFigures):
    """The budget without kernel launches or bisection (``tracekit.budget.measure.BUDGET_KEYS``)."""

    schema: str
    device: int
    name: str | None
    pci_bus_id: str | None
    driver_version: str | None
    cuda_driver_version: int | None
    cuda_runtime_version: int | None
    nvml: bool | None
    context_existed: bool | None
    nvml_total: int | None
    nvml_reserved: int | None
    nvml_used_before: int | None
    nvml_free_before: int | None
    nvml_used_v1_before: int | None
    other_processes: list[OtherProcess]
    other_processes_bytes: int | None
    cuda_total: int  # cudaMemGetInfo answers wherever there is a device: never None
    cuda_free: int
    context_create_s: float | None
    context_bytes: int | None
    context_and_others_bytes: int
    nvml_used_after: int | None
    stack_size: int | None
    printf_fifo_size: int | None
    malloc_heap_size: int | None
    sm_count: int | None
    max_threads_per_sm: int | None
    local_memory_model_bytes: int | None
    measured_at: str | None


class LargestAllocation(TypedDict):
    """``--probe-largest``: the bisection for the largest cudaMalloc (``tracekit.budget.probe``)."""

    free: int
    largest: int
    gap: int  # free - largest
    fraction: float | None  # largest / free
    attempts: int
    step: int  # the bisection's resolution
    free_after: int


class Granularity(TypedDict):
    """Device bytes taken by ``count`` cudaMallocs of ``request`` bytes (the free-memory drop)."""

    request: int
    count: int
    cost: int
    per_allocation: int
    alignment: int  # largest power of two dividing every pointer, at most 2 MiB


class Probe(TypedDict):
    largest: LargestAllocation
    granularity: list[Granularity]


class KernelLocal(TypedDict):
    """``--kernel-local-bytes``: one kernel's cost in free memory (``tracekit.budget.kernel_probe``)."""

    local_bytes: int  # asked per thread
    local_size_bytes: int  # what the compiler gave it
    grid: int
    block: int
    free_before: int
    load_bytes: int  # free drop at module load
    launch_bytes: int  # free drop at the first launch (the local-memory reservation)
    kept_bytes: int  # free drop kept after the kernel and its output are gone
    stack_size_before: int
    stack_size_after: int
    model_bytes: int  # local_size_bytes x max threads per SM x SMs
    launch_over_model: float | None
    free_after_restore: int | None
    restore_gave_back: int | None  # free regained by setting the stack limit back


class FinalFigures(PoolFigures):
    """cudaMemGetInfo free after the probes (what the equation's ``free`` term uses)."""

    cuda_free: int


class Budget(CheapBudget):
    """The full budget: the cheap one and the probes asked for."""

    probe: NotRequired[Probe]
    kernel_local: NotRequired[KernelLocal]
    final: NotRequired[FinalFigures]
