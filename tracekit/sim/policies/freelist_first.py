"""The ``first-fit`` policy of the address-ordered free list (see ``freelist``)."""

from __future__ import annotations

from tracekit.sim.policies.freelist import Fit, FreeListModel


class FirstFit(FreeListModel):
    name = "first-fit"
    description = "Address-ordered free list; the lowest-addressed free block that fits"
    fit = Fit.FIRST


MODEL = FirstFit()
