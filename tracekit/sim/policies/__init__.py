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

Listing is cheap: the registry keeps an index of every discovered policy's module, name,
description and traits (``__pycache__/policies.<tag>.<key>.index``, the key made of each policy
module's and the traits' sources' names, sizes and mtimes, as a ``.pyc`` is), so a process that
asks for names or traits imports no policy module, and so no kernel and no numba (``replay``
checks ``--sim`` and reads its traits before the first read of the trace: issue 45). The policy
comes back as a ``Listed``, which imports its module on ``run`` (or any other attribute). Where the
index is missing or stale, every public module is imported as before and the index written again
(nothing where the folder cannot be written). A policy module should still import its kernel, and
the shared modules that are compiled or import numba (``prepare``, ``pool_run``, ``chunks``,
``segments``, ``sizeclass``, ``treap``), inside ``run``: the first listing after a change then
stays cheap too, and a verb loads only its own policy's kernels. docs/simulator.md shows the form.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import os
import pickle
import pkgutil
import sys
from pathlib import Path
from typing import Any, ClassVar

from tracekit.errors import UsageError
from tracekit.sim.base import Allocator, AllocatorModel, Layout, PolicyRun, PolicyTraits, SimConfig
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Source

_ADDED: dict[str, AllocatorModel] = {}
_HERE = Path(__file__).resolve().parent
# What the index's entries are made of besides the policy modules: the traits' types.
_TRAIT_SOURCES = (_HERE.parent / "base.py", _HERE.parent / "allocators.py",
                  _HERE.parents[1] / "trace" / "schema.py")


class Listed:
    """A policy as the index lists it: its name, description and traits, its module imported (and
    its kernel with it) only when the policy is run or asked for anything else (``listed_as``)."""

    module: ClassVar[str]
    name: ClassVar[str]
    description: ClassVar[str]
    traits: ClassVar[PolicyTraits]

    def model(self) -> AllocatorModel:
        model: AllocatorModel = importlib.import_module(f"{__name__}.{self.module}").MODEL
        return model

    def run(self, trace: Trace, config: SimConfig) -> PolicyRun:
        return self.model().run(trace, config)

    def __getattr__(self, attr: str) -> Any:  # anything else a policy's MODEL has
        return getattr(self.model(), attr)


def listed_as(module: str, name: str, description: str, traits: PolicyTraits) -> Listed:
    """The ``Listed`` policy of one index entry (its own class: the contract's names are class names)."""
    kind = type(f"Listed[{name}]", (Listed,), {"module": module, "name": name, "description": description,
                                               "traits": traits})
    listed: Listed = kind()
    return listed


def _public_modules() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def _index_path(modules: list[str]) -> Path:
    """The index's file, named by what it was built from (each source's name, size and mtime), as a
    ``.pyc`` is: an edited, added or removed module names another file, so a stale one is never read."""
    stamp = [(f.name, st.st_size, st.st_mtime_ns)
             for f in (*(_HERE / f"{m}.py" for m in modules), *_TRAIT_SOURCES) if (st := f.stat())]
    key = hashlib.sha256(repr(stamp).encode()).hexdigest()[:16]
    return _HERE / "__pycache__" / f"policies.{sys.implementation.cache_tag}.{key}.index"


def _imported(modules: list[str]) -> dict[str, tuple[str, AllocatorModel]]:
    """Every public module's ``MODEL`` by its name, with the module's name."""
    found: dict[str, tuple[str, AllocatorModel]] = {}
    for module in modules:
        model = getattr(importlib.import_module(f"{__name__}.{module}"), "MODEL", None)
        if model is None:
            continue
        if model.name in found:
            raise RuntimeError(f"two policy modules are named {model.name!r}")
        found[model.name] = (module, model)
    return found


def _write_index(path: Path, entries: list[tuple[str, str, str, PolicyTraits]]) -> None:
    """The index, written whole (a reader sees it complete or not at all); nothing where the folder
    may not be written (an install of another user's: every listing then imports the modules)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(exist_ok=True)
        for old in path.parent.glob(f"policies.{sys.implementation.cache_tag}.*.index"):
            old.unlink(missing_ok=True)
        with open(tmp, "wb") as f:
            pickle.dump(entries, f)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


@functools.cache
def _discovered() -> dict[str, AllocatorModel]:
    """The policies of this package: from the index where it is current (no module imported), else
    by importing every public module, writing the index for the next process."""
    modules = _public_modules()
    path = _index_path(modules)
    try:
        with open(path, "rb") as f:
            entries = pickle.load(f)  # written by _write_index, beside the modules' own .pyc files
        return {name: listed_as(module, name, description, traits)
                for module, name, description, traits in entries}
    except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
        pass  # none yet, or unreadable: built again below
    found = _imported(modules)
    _write_index(path, [(module, m.name, m.description, m.traits) for module, m in found.values()])
    return {name: m for name, (_, m) in found.items()}


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
