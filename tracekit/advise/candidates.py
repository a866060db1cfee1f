"""What ``advise`` can change for a trace, as typed candidates with a paste-ready line each.

- **PyTorch** (``torch`` traces): allocator settings in ``PYTORCH_CUDA_ALLOC_CONF`` syntax.
  ``single_torch`` gives the defaults and every single key: ``expandable_segments:True``,
  ``max_split_size_mb`` ∈ {64, 128, 256, 512, 1024}, ``roundup_power2_divisions`` ∈ {2, 4, 8},
  ``garbage_collection_threshold`` ∈ {0.6, 0.8} (PyTorch collects only under a limit).
  ``combine_torch`` then pairs and triples the two best values of each key (pruning:
  a key whose values never helped alone is not combined); ``max_split_size_mb`` is never
  combined with expandable segments, which PyTorch does not support.
- **CuPy** (``cupy`` traces): the default pool, ``set_limit`` at the smallest fitting size,
  ``free_all_blocks()`` before each request of the failing request's call-site,
  ``MemoryAsyncPool`` and plain ``cudaMalloc`` (the registry policies modelling
  ``Allocator.CUPY_ASYNC`` and ``Allocator.CUDA``, both on the device's footprint:
  on the H200 the device showed no external fragmentation, so they fit when the live
  bytes, at the device's granularity, fit).
- **RMM** (``rmm`` traces, ``import rmm``): its pool at the limit as ``maximum_pool_size`` (as
  recorded: RMM's default initial size), ``CudaAsyncMemoryResource`` and plain
  ``CudaMemoryResource`` (the registry policies modelling ``Allocator.CUPY_ASYNC`` and
  ``Allocator.CUDA``: cudaMallocAsync and cudaMalloc themselves). Not offered yet: the pool reserved
  whole at start (``initial_pool_size`` = ``maximum_pool_size``), whose peak reserved is its
  capacity by construction, so headroom cannot judge it.
- **Raw traces** (anything else): the free-list policies of the simulator registry
  (policies whose replay reports a heap extent), at the limit as heap size.
- **The program's own CuPy pool** (``PoolScope``): where the failing request was in a
  ``MemoryPool`` the program made and set a limit on, every CuPy line is said of that pool (its
  ``set_limit``, its ``free_all_blocks()``, its ``malloc`` replaced), never of the default pool.
- **Overhead cures** (when the device ran out, not a pool limit): one ``Cure`` per term of
  the device budget the user controls (the stack limit, the malloc heap, the printf FIFO,
  module loading, another process, another pool of this process), each with the bytes it
  gives back; a candidate holds a set of them and is the recorded setting replayed with
  the room those bytes add (``tracekit.advise.overhead``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from itertools import combinations, product
from pathlib import PurePosixPath
from typing import TypedDict

from tracekit.analysis.oom_budget import How  # how a cure's bytes were had, as the budget says
from tracekit.inputs import safe_text, shell_word
from tracekit.sim import policies
from tracekit.sim.base import Allocator

TORCH_GRID: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("expandable_segments", ("True",)),
    ("max_split_size_mb", ("64", "128", "256", "512", "1024")),
    ("roundup_power2_divisions", ("2", "4", "8")),
    ("garbage_collection_threshold", ("0.6", "0.8")),
)
_EXCLUSIVE = frozenset({"expandable_segments", "max_split_size_mb"})


class Kind(StrEnum):
    """How a candidate is evaluated."""

    TORCH_CONF = "torch-conf"  # the torch policy under these allocator settings
    CUPY_POOL = "cupy-pool"  # the cupy policy (options: none), at the limit
    CUPY_LIMIT = "cupy-set-limit"  # the cupy policy at the smallest fitting set_limit
    CUPY_RELEASE = "cupy-free-all-blocks"  # the cupy policy with free_all_blocks() before a call-site
    CUPY_ASYNC = "cupy-async"  # MemoryAsyncPool, on the policy modelling it (the device's footprint)
    CUDA_MALLOC = "cudamalloc"  # plain cudaMalloc per request, on the policy modelling it (likewise)
    RMM_POOL = "rmm-pool"  # RMM's pool_memory_resource (options: as recorded), the limit its maximum
    RMM_ASYNC = "rmm-cuda-async"  # CudaAsyncMemoryResource, on the policy modelling cudaMallocAsync
    RMM_CUDA = "rmm-cuda"  # CudaMemoryResource (no pool), on the policy modelling cudaMalloc
    FREE_LIST = "free-list"  # a heap policy of the registry
    # Overhead cures: the recorded setting with the room the cure gives back.
    STACK_LIMIT = "stack-limit"  # local memory: the stack limit lowered after the kernel
    MALLOC_HEAP = "malloc-heap"  # the device malloc heap limit, set before the first malloc kernel
    PRINTF_FIFO = "printf-fifo"  # the printf FIFO limit, set before the first printf kernel
    MODULE_LOADING = "module-loading"  # CUDA_MODULE_LOADING=LAZY
    OTHER_PROCESS = "other-process"  # another process on the device
    OTHER_POOL = "other-pool"  # another pool of this process holding free cached bytes
    CURES = "overhead-cures"  # several cures at once


CURE_KINDS = frozenset({Kind.STACK_LIMIT, Kind.MALLOC_HEAP, Kind.PRINTF_FIFO, Kind.MODULE_LOADING,
                        Kind.OTHER_PROCESS, Kind.OTHER_POOL})


@dataclass(frozen=True)
class Cure:
    """One term of the device budget the user controls, and what changing it gives back.

    ``returns``: bytes the device gets back; ``how`` says how that figure was had and
    ``why`` gives its source or formula; ``action`` is the exact line or step, ``when``
    its timing (after the kernel, before the first kernel, before the process starts).
    """

    kind: Kind
    target: str  # what is changed: "stack limit 16 KiB -> 1 KiB per thread", "process 495 (python3)"
    returns: int
    how: How
    why: str
    action: str
    when: str
    alternative: str = ""
    own: bool = True  # a term of this process (False: another process)
    named: bool = True  # the budget names what holds the bytes (False: only that this process holds them)

    def to_dict(self) -> CureDict:
        return {"kind": self.kind.value, "target": self.target, "returns_bytes": self.returns,
                "how": self.how.value, "why": self.why, "action": self.action, "when": self.when,
                "alternative": self.alternative or None, "own_process": self.own}


class CureDict(TypedDict):
    """One cure in ``advise --json`` (``cures``, and in each cure candidate of ``fits``/``tried``)."""

    kind: str
    target: str
    returns_bytes: int
    how: str
    why: str
    action: str
    when: str
    alternative: str | None
    own_process: bool


class PoolScopeDict(TypedDict):
    """``pool`` in ``advise --json``: the program's own pool the search was of (``PoolScope``)."""

    id: int
    device: int
    label: str | None
    limit_bytes: int
    alone: bool


@dataclass(frozen=True)
class PoolScope:
    """The program's own CuPy pool the failing request was in (not its device's default pool), which
    advise searched at the limit the program set on it (``limit``, bytes). ``alone``: its rows were
    replayed alone (the trace's ``pool`` column marks them); False: the column does not mark the
    failing request as that pool's, so every row of the device was replayed under its limit (what
    the search finds is then an upper estimate of what that pool needs). ``label``: the recorder's, text
    from the trace."""

    id: int
    device: int
    label: str | None
    limit: int
    alone: bool = True

    def name(self) -> str:
        """What follows "the program's own pool" in a sentence: ``'user 1' (pool 1 on device 0)``, or
        ``1 on device 0`` for a pool without a label; the label made safe to print."""
        if not self.label:
            return f"{self.id} on device {self.device}"
        return f"'{safe_text(self.label)}' (pool {self.id} on device {self.device})"

    def to_dict(self) -> PoolScopeDict:
        return {"id": self.id, "device": self.device, "label": self.label, "limit_bytes": self.limit,
                "alone": self.alone}


@dataclass(frozen=True)
class Candidate:
    """One setting to try: ``options`` are policy options as sorted (key, value) pairs.

    A cure candidate (``kind`` a cure kind, or ``CURES`` for several) replays the recorded
    setting (``policy``/``options`` as recorded) with the room its ``cures`` give back.
    """

    kind: Kind
    policy: str | None
    options: tuple[tuple[str, str], ...] = ()
    site: str | None = None  # CUPY_RELEASE: the call-site
    cures: tuple[Cure, ...] = ()

    @property
    def opts(self) -> dict[str, str]:
        return dict(self.options)

    @property
    def keys(self) -> int:
        """How many things the user changes (0 = the current setting)."""
        if self.cures:
            return len(self.cures)
        return len(self.options) if self.kind == Kind.TORCH_CONF else int(self.kind != Kind.CUPY_POOL)

    @property
    def returns(self) -> int:
        """Bytes the cures give back together (0 for a setting)."""
        return sum(c.returns for c in self.cures)

    def label(self) -> str:
        if self.cures:
            return " + ".join(c.target for c in self.cures)
        if self.kind == Kind.TORCH_CONF:
            return conf_text(self.opts) or "PyTorch defaults"
        if self.kind == Kind.FREE_LIST:
            return f"{self.policy} free list"
        return {
            Kind.CUPY_POOL: "CuPy default pool", Kind.CUPY_LIMIT: "CuPy pool, set_limit",
            Kind.CUPY_RELEASE: f"free_all_blocks() before {safe_text(PurePosixPath(self.site or '').name)}",
            Kind.CUPY_ASYNC: "MemoryAsyncPool (modelled as the device allocator)",
            Kind.CUDA_MALLOC: "plain cudaMalloc (modelled as the device allocator)",
            Kind.RMM_POOL: "RMM pool, maximum_pool_size",
            Kind.RMM_ASYNC: "RMM CudaAsyncMemoryResource (modelled as the device allocator)",
            Kind.RMM_CUDA: "RMM CudaMemoryResource, no pool (modelled as the device allocator)",
        }[self.kind]

    def line(self, capacity: int | None, trace: str = "TRACE", pool: PoolScope | None = None) -> str:
        """The paste-ready line for this candidate (``capacity``: the limit it was checked at); ``pool``:
        the program's own CuPy pool the search was of, which a CuPy line then names instead of the
        default pool."""
        cap = str(capacity) if capacity else "SIZE"
        if pool is not None and self.kind in _OWN_POOL_LINES:
            return _OWN_POOL_LINES[self.kind].format(cap=cap, site=safe_text(self.site), pool=pool.name())
        if self.cures:
            return "; ".join(c.action for c in self.cures)
        if self.kind == Kind.TORCH_CONF:  # PyTorch's defaults: the variable unset, not set empty
            conf = conf_text(self.opts)
            return f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "env -u PYTORCH_CUDA_ALLOC_CONF"
        if self.kind == Kind.CUPY_LIMIT:
            return f"cupy.get_default_memory_pool().set_limit(size={cap})"
        if self.kind == Kind.CUPY_POOL:
            return f"cupy.get_default_memory_pool().set_limit(size={cap})"
        if self.kind == Kind.CUPY_RELEASE:
            return (f"cupy.get_default_memory_pool().free_all_blocks()  # at {safe_text(self.site)}, "
                    "before allocating")
        if self.kind == Kind.CUPY_ASYNC:
            return "cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)"
        if self.kind == Kind.CUDA_MALLOC:
            return "cupy.cuda.set_allocator(None)"
        if self.kind == Kind.RMM_POOL:
            initial = self.opts.get("initial_pool_size", "0")
            return (f"rmm.reinitialize(pool_allocator=True, initial_pool_size={initial}, "
                    f"maximum_pool_size={cap})")
        if self.kind == Kind.RMM_ASYNC:
            return "rmm.mr.set_current_device_resource(rmm.mr.CudaAsyncMemoryResource())"
        if self.kind == Kind.RMM_CUDA:
            return "rmm.reinitialize(pool_allocator=False)"
        where = shell_word(trace) if trace != "TRACE" else trace
        return f"tracekit replay {where} --sim {self.policy} --capacity {cap}"


# A CuPy line said of the program's own pool (``PoolScope``): the program holds it in a variable this
# trace cannot name (``pool`` below), and installs it with ``set_allocator``/``using_allocator``.
_OWN = "pool: the program's own cupy.cuda.MemoryPool {pool}, not the default pool"
_OWN_POOL_LINES = {
    Kind.CUPY_LIMIT: "pool.set_limit(size={cap})  # " + _OWN,
    Kind.CUPY_POOL: "pool.set_limit(size={cap})  # " + _OWN,
    Kind.CUPY_RELEASE: "pool.free_all_blocks()  # at {site}, before allocating; " + _OWN,
    Kind.CUPY_ASYNC: ("cupy.cuda.MemoryAsyncPool().malloc  # in place of pool.malloc where the program "
                      "installs it; " + _OWN),
    Kind.CUDA_MALLOC: ("cupy.cuda.using_allocator(None)  # in place of pool.malloc where the program "
                       "installs it (plain cudaMalloc); " + _OWN),
}


def conf_text(opts: Mapping[str, str]) -> str:
    """``key:value,...`` in PyTorch's syntax, keys in grid order."""
    order = [k for k, _ in TORCH_GRID]
    keys = sorted(opts, key=lambda k: (order.index(k) if k in order else len(order), k))
    return ",".join(f"{k}:{opts[k]}" for k in keys)


def torch(opts: Mapping[str, str]) -> Candidate:
    return Candidate(Kind.TORCH_CONF, policies.modelling(Allocator.TORCH), tuple(sorted(opts.items())))


def single_torch() -> list[Candidate]:
    """The defaults and each key of the grid alone."""
    return [torch({})] + [torch({k: v}) for k, values in TORCH_GRID for v in values]


def combine_torch(best: Mapping[str, Iterable[str]]) -> list[Candidate]:
    """Pairs of the best values (up to two per key) and triples of the single best per key."""
    out: list[Candidate] = []
    keys = [k for k, _ in TORCH_GRID if list(best.get(k, ()))]
    for a, b in combinations(keys, 2):
        if {a, b} == _EXCLUSIVE:
            continue
        for va, vb in product(list(best[a])[:2], list(best[b])[:2]):
            out.append(torch({a: va, b: vb}))
    for trio in combinations(keys, 3):
        if set(trio) >= _EXCLUSIVE:
            continue
        out.append(torch({k: next(iter(best[k])) for k in trio}))
    return out


def cupy_pool(kind: Kind = Kind.CUPY_POOL) -> Candidate:
    """A setting of CuPy's pool (``kind``: as recorded, or ``set_limit``), on the policy modelling it."""
    return Candidate(kind, policies.modelling(Allocator.CUPY))


def cupy(site: str | None) -> list[Candidate]:
    """The CuPy candidates evaluated at the limit (``set_limit`` is searched separately)."""
    out = [cupy_pool()]
    if site is not None:
        out.append(Candidate(Kind.CUPY_RELEASE, policies.modelling(Allocator.CUPY), site=site))
    out += [Candidate(Kind.CUPY_ASYNC, policies.modelling(Allocator.CUPY_ASYNC)),
            Candidate(Kind.CUDA_MALLOC, policies.modelling(Allocator.CUDA))]
    return out


def rmm_pool() -> Candidate:
    """RMM's pool growing from empty (``initial_pool_size=0``), the limit its ``maximum_pool_size``.

    The initial size is said, not left to RMM's default: that is half the free device memory, and
    RMM refuses a maximum below it ("Initial pool size exceeds the maximum pool size!"), so a line
    without it fails on most devices; and a pool reserved whole at the start peaks at its maximum by
    construction, where no headroom can judge it."""
    return Candidate(Kind.RMM_POOL, policies.modelling(Allocator.RMM_POOL), (("initial_pool_size", "0"),))


def rmm() -> list[Candidate]:
    return [rmm_pool(),
            Candidate(Kind.RMM_ASYNC, policies.modelling(Allocator.CUPY_ASYNC)),
            Candidate(Kind.RMM_CUDA, policies.modelling(Allocator.CUDA))]


def free_lists(heaps: Iterable[str]) -> list[Candidate]:
    return [Candidate(Kind.FREE_LIST, name) for name in heaps]
