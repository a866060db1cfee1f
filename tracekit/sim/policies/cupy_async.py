"""``cupy-async``: CuPy's ``MemoryAsyncPool`` (``cudaMallocAsync`` on the device's mempool), simulated.

CuPy rounds each request to 512 B and calls ``cudaMallocAsync`` on the current stream;
the driver's pool serves it from memory it holds or maps more. As CuPy configures the pool
(``MemoryAsyncPool()`` calls ``set_limit()``, which sets ``cudaMemPoolAttrReleaseThreshold``
to UINT64_MAX, "ensure pool size is never shrunk"; cupy/cuda/memory.pyx, 14.2) the pool
gives nothing back at a synchronization: reserved bytes only grow until
``free_all_blocks()`` trims the pool. What is exact and what is a model:

- **exact**: CuPy's rounding (⌈s / 512⌉ · 512, the live bytes), and that the pool keeps
  what it mapped: reserved = max over time of the pool's size (the recording
  ``traces/cupy-async.parquet`` shows device memory never falling while blocks were freed);
- **a model**: the pool's size is ⌈live / 2 MiB⌉ · 2 MiB, as if the driver packed the live
  bytes into 2 MiB pages with no fragmentation inside the pool, and a request fails when
  that size would pass the capacity. This is optimistic: on ``cupy-async`` the real pool grew
  in steps of 32 or 64 MiB to 736 MiB while this model's peak is 502 MiB, and on
  ``cupy-oom-frag`` at 256 MiB the real pool ran out at seq 80 (256 MiB held, 63.5 MiB live,
  a 64 MiB request) where this model fits (docs/fidelity.md);
- **not modelled**: a ``set_limit`` on the async pool (a soft limit: the release threshold,
  and CuPy's own early ``OutOfMemoryError`` when the pool is short of free bytes), streams
  (the pool's reuse across streams follows event dependencies the trace does not carry);
  addresses are invented.

``--capacity`` is the device memory the pool may take, as for ``replay --device --allocator
cupy-async``. No allocator rows: the recorded async pool has none either.
"""

from __future__ import annotations

from tracekit.sim.base import Allocator, Basis, Layout, PolicyTraits
from tracekit.sim.policies.device_model import DeviceModel


class CupyAsync(DeviceModel):
    name = "cupy-async"
    description = ("CuPy MemoryAsyncPool (cudaMallocAsync): the live bytes in 2 MiB pages, never given back "
                   "(CuPy's release threshold), no fragmentation inside the pool")
    traits = PolicyTraits(Layout.POOL, whatif=False, rank=8, models=Allocator.CUPY_ASYNC,
                          basis=Basis.FOOTPRINT)
    pooled = True


MODEL = CupyAsync()
