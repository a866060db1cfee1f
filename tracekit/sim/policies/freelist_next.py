"""The ``next-fit`` policy of the address-ordered free list (see ``freelist``)."""

from __future__ import annotations

from tracekit.sim.base import Layout, PolicyTraits
from tracekit.sim.policies.freelist import Fit, FreeListModel


class NextFit(FreeListModel):
    name = "next-fit"
    description = "Address-ordered free list; first fit from a roving pointer, wrapping around"
    fit = Fit.NEXT
    traits = PolicyTraits(Layout.HEAP, rank=2)


MODEL = NextFit()
