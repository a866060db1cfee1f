"""The ``best-fit`` policy of the address-ordered free list (see ``freelist``)."""

from __future__ import annotations

from tracekit.sim.base import Layout, PolicyTraits
from tracekit.sim.policies.freelist import Fit, FreeListModel


class BestFit(FreeListModel):
    name = "best-fit"
    description = "Address-ordered free list; the smallest free block that fits (ties: lowest address)"
    fit = Fit.BEST
    traits = PolicyTraits(Layout.HEAP, rank=0)


MODEL = BestFit()
