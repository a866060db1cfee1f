"""The ``first-fit`` policy of the address-ordered free list (see ``freelist``)."""

from __future__ import annotations

from tracekit.sim.base import Layout, PolicyTraits
from tracekit.sim.policies.freelist import Fit, FreeListModel


class FirstFit(FreeListModel):
    name = "first-fit"
    description = "Address-ordered free list; the lowest-addressed free block that fits"
    fit = Fit.FIRST
    traits = PolicyTraits(Layout.HEAP, rank=1)


MODEL = FirstFit()
