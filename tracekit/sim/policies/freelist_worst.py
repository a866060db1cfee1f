"""The ``worst-fit`` policy of the address-ordered free list (see ``freelist``)."""

from __future__ import annotations

from tracekit.sim.base import Layout, PolicyTraits
from tracekit.sim.policies.freelist import Fit, FreeListModel


class WorstFit(FreeListModel):
    name = "worst-fit"
    description = "Address-ordered free list; the largest free block (ties: lowest address)"
    fit = Fit.WORST
    traits = PolicyTraits(Layout.HEAP, rank=3)


MODEL = WorstFit()
