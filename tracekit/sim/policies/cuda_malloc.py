"""``cuda``: plain cudaMalloc per request (``cupy.cuda.set_allocator(None)``) as a simulated allocator.

Every request is one ``cudaMalloc``, every free one ``cudaFree``; nothing is cached. What
the device takes for a block of s bytes, as measured on the H200 (h200-facts §3, driver
580.159, CUDA 13):

- **exact** above 1 MiB: ⌈s / 2 MiB⌉ · 2 MiB, on a 2 MiB boundary (1 MiB + 1 B took
  2 MiB, 2 MiB + 1 B took 4 MiB, 64 MiB + 1 B took 66 MiB);
- **a model** at 1 MiB and below: ⌈s / 512⌉ · 512. The driver sub-allocates such blocks
  inside shared 2 MiB pages (four 512 B blocks sat 512 B apart in one page), so what a
  page holds is counted, not the page; a page part-used by small blocks is not charged
  whole. On ``cupy-oom-frag`` at 256 MiB the device's peak was this figure to the byte
  (docs/fidelity.md, 228,589,568 B);
- **a model**: the device does not fragment (h200-facts §6), so a request fails only when
  Σ_live cost + cost(s) exceeds the capacity; and addresses are invented (the driver's
  are not predictable: consecutive allocations jumped 73 MiB, or went downwards).

Reserved bytes are Σ_live cost after every event; the context, library workspaces and
local memory the program's kernels reserve are not counted (``--capacity`` is what the
allocations may take). No allocator rows: each request is itself the device call.
"""

from __future__ import annotations

from tracekit.sim.base import Allocator, Basis, Layout, PolicyTraits
from tracekit.sim.policies.device_model import DeviceModel


class CudaMalloc(DeviceModel):
    name = "cuda"
    description = ("plain cudaMalloc per request (no pool): 2 MiB pages above 1 MiB, 512 B below, "
                   "fails only when the device's bytes run out")
    traits = PolicyTraits(Layout.POOL, whatif=False, rank=7, models=Allocator.CUDA, basis=Basis.FOOTPRINT)
    pooled = False


MODEL = CudaMalloc()
