"""The simulated allocator policies, one module each, found by discovery; the one registry.

Every public module in this package that defines ``MODEL`` (an object
satisfying ``tracekit.sim.base.AllocatorModel``) is a policy, known by
``MODEL.name``; public modules without ``MODEL`` are shared machinery, and
modules whose name starts with an underscore are private helpers (a policy's
kernel, say) that discovery does not import. Adding a policy is adding a
module (and its private kernel): nothing else changes, because every place that
needs to know about policies asks this registry: ``replay --sim``'s help and its
default capacity, ``whatif``'s and ``advise``'s default search
(``whatif_defaults``), the policy matching a recording (``for_source``), the
policy modelling a real allocator (``modelling``, ``allocator_of``) and
analysis (``is_heap``), from each policy's
``PolicyTraits``. ``register`` adds a policy defined elsewhere (a plugin, a
test). Modules are imported on the first call, so importing this package stays cheap.

The convention that keeps asking the registry cheap: a policy module imports its kernel, and every
shared module that is compiled or imports numba (``prepare``, ``pool_run``, ``chunks``,
``segments``, ``sizeclass``, ``treap``), inside ``run``, never at its top; ``@njit`` functions live
in its private kernel module. Discovery then imports no numba, so ``replay`` checks ``--sim`` and
reads its traits before the first read of the trace without loading a kernel (issue 45). A module
that breaks the convention still works, only slower to list;
``tests/cli/test_startup_imports.py`` names it. docs/simulator.md, "Adding a policy", shows the form.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil

from tracekit.errors import UsageError
from tracekit.sim.base import Allocator, AllocatorModel, Layout, PolicyTraits
from tracekit.trace.schema import Source

_ADDED: dict[str, AllocatorModel] = {}


@functools.cache
def _discovered() -> dict[str, AllocatorModel]:
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
    return found


def models() -> dict[str, AllocatorModel]:
    """All policies by name, in name order. Two modules claiming one name is a bug."""
    return dict(sorted({**_discovered(), **_ADDED}.items()))


def register(model: AllocatorModel) -> None:
    """Add a policy defined outside this package; its name must be new."""
    if model.name in models():
        raise ValueError(f"a policy named {model.name!r} exists already")
    _ADDED[model.name] = model


def unregister(name: str) -> None:
    """Remove a policy added by ``register`` (discovered ones stay)."""
    _ADDED.pop(name, None)


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


def traits(name: str) -> PolicyTraits | None:
    """The traits of the policy called ``name``, None if no such policy is known here."""
    model = models().get(name)
    return model.traits if model is not None else None


def listed() -> list[str]:
    """Names in listing order (rank, then name)."""
    return [m.name for m in sorted(models().values(), key=lambda m: (m.traits.rank, m.name))]


def of_layout(layout: Layout) -> list[str]:
    """Names of the policies of one layout, in listing order."""
    return [n for n in listed() if models()[n].traits.layout == layout]


def is_heap(name: str) -> bool:
    """Whether a replay under ``name`` models the device as one heap of ``capacity`` bytes."""
    t = traits(name)
    return t is not None and t.layout == Layout.HEAP


def is_pool(name: str) -> bool:
    """Whether ``name`` is a pool policy (its capacity is a pool limit over device allocations)."""
    t = traits(name)
    return t is not None and t.layout == Layout.POOL


def for_source(source: Source) -> str | None:
    """The policy that models the allocator a trace from ``source`` was recorded through, if any."""
    found = [n for n in listed() if models()[n].traits.reproduces == source]
    return found[0] if found else None


def modelling(allocator: Allocator) -> str:
    """The policy whose traits say it models ``allocator`` (the first in listing order).

    Every caller asks for an allocator some policy models; none is a bug (RuntimeError).
    """
    found = [n for n in listed() if models()[n].traits.models == allocator]
    if not found:
        raise RuntimeError(f"no policy models the {allocator.value} allocator")
    return found[0]


def allocator_of(name: str) -> Allocator | None:
    """The real allocator the policy called ``name`` models, None for a model of an idea or no policy."""
    t = traits(name)
    return t.models if t is not None else None


def whatif_defaults() -> list[str]:
    """The policies ``whatif`` and ``advise`` search when none are named, in listing order."""
    return [n for n in listed() if models()[n].traits.whatif]


def help_text() -> str:
    """One line naming every policy by layout, for ``--sim``'s help."""
    heaps, pools = of_layout(Layout.HEAP), of_layout(Layout.POOL)
    parts = []
    if heaps:
        parts.append(f"{', '.join(heaps)} (one heap; --capacity is its size)")
    if pools:
        parts.append(f"{', '.join(pools)} (pools; --capacity is the pool limit)")
    return "; ".join(parts)
