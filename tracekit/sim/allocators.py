"""The real allocators tracekit knows: what a policy's traits say it models, what a device replay runs.

Light on purpose (no NumPy, no numba): the device replay's planning and the
CLI import it without the simulator's kernels.
"""

from __future__ import annotations

from enum import StrEnum


class Allocator(StrEnum):
    """The real allocators a policy can model (the names ``replay --device --allocator`` takes)."""

    CUDA = "cuda"  # every malloc a cudaMalloc, every free a cudaFree
    CUPY = "cupy"  # CuPy's MemoryPool over cudaMalloc
    CUPY_ASYNC = "cupy-async"  # CuPy's MemoryAsyncPool (cudaMallocAsync)
    TORCH = "torch"  # PyTorch's CUDA caching allocator
    RMM_POOL = "rmm-pool"  # RMM's pool_memory_resource over cuda_memory_resource
