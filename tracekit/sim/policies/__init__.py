"""The simulated allocator policies, one module each, found by discovery.

Every public module in this package that defines ``MODEL`` (an object
satisfying ``tracekit.sim.base.AllocatorModel``) is a policy, known by
``MODEL.name``; public modules without ``MODEL`` are shared machinery, and
modules whose name starts with an underscore are private helpers that
discovery does not import (their policy module imports them). Adding a policy is adding a
module: nothing else changes. Modules are imported on the first call to
``models()``, so importing this package stays cheap.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from tracekit.errors import UsageError
from tracekit.sim.base import AllocatorModel


@functools.cache
def models() -> dict[str, AllocatorModel]:
    """All policies by name, in name order. Two modules claiming one name is a bug."""
    found: dict[str, AllocatorModel] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        model = getattr(mod, "MODEL", None)
        if model is None:
            continue
        if model.name in found:
            raise RuntimeError(f"two policy modules are named {model.name!r}")
        found[model.name] = model
    return dict(sorted(found.items()))


def names() -> list[str]:
    return list(models())


def get(name: str) -> AllocatorModel:
    """The policy called ``name``; a UsageError listing the valid names otherwise."""
    table = models()
    try:
        return table[name]
    except KeyError:
        raise UsageError(
            f"unknown policy {name!r} for --sim; choose one of: {', '.join(table)}"
        ) from None
