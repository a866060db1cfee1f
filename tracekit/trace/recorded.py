"""The recorder's metadata keys, parsed once into frozen dataclasses (``TraceMeta.recorded``).

A trace's ``tracekit`` metadata holds, beyond the keys ``TraceMeta`` has fields for, what the
recorder measured (docs/trace-format.md): the device at every OOM (``oom_states``), the hook's
view of each OOM (``ooms``), the pools (``pools``, ``pools_end``), the device budget at the start
(``budget``), the ``cudaLimit`` values (``device_limits``), how the program ended (``exit``) and
how stacks were recorded (``recorder``, ``sites_relative_to``), the PyTorch allocator settings the
run had (``torch_allocator_settings``) and how to run the program again (``rerun``).
``RecordedMeta.from_extra`` reads
them from ``TraceMeta.extra`` once; every verb takes these objects instead of the raw mapping, which
stays as it is for writers and exports.

The parse is as tolerant as the readers it replaced: a key that is missing, or a value of the wrong
type, out of range (a negative byte count, an integer beyond 64 bits, a boolean, a fraction) or
otherwise unusable is left out (None, an empty tuple, an entry skipped), never an error: analysis
never fails on metadata it cannot use. Lists are bounded as before: at most ``MAX_STATES`` entries
of ``oom_states`` and ``ooms``, ``MAX_ENTRIES`` of ``pools``, ``pools_end``, a process list and
``sites_relative_to``; the rest is ignored. Every figure is bytes, exact.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tracekit.inputs import optional_int

MAX_STATES = 100_000  # a longer list of per-OOM entries is not a recording; the rest is ignored
MAX_ENTRIES = 4096  # pools, process lists, folders: more is not a recording either
TORCH_SETTINGS_KEY = "torch_allocator_settings"  # PyTorch's allocator settings (``TorchSettings``)


def as_int(v: Any) -> int | None:
    """An exact integer from JSON, or None (bools, fractions, strings and NaN are not)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**63:
        return int(v)
    return None


def as_bytes(v: Any) -> int | None:
    """A byte count: an exact integer ≥ 0, else None."""
    n = as_int(v)
    return n if n is not None and n >= 0 else None


def as_text(v: Any) -> str | None:
    """A JSON string, else None."""
    return v if isinstance(v, str) else None


def _mapping(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


@dataclass(frozen=True)
class ProcessUse:
    """One process's used device memory as NVML reported it."""

    pid: int
    name: str | None
    used: int
    is_self: bool

    def label(self) -> str:
        return f"process {self.pid}" + (f" ({self.name})" if self.name else "")

    @classmethod
    def list_from_extra(cls, raw: Any) -> tuple[ProcessUse, ...] | None:
        """An ``oom_states`` entry's ``processes``: entries without a usable pid or ``used_bytes``
        are skipped; None where there is no list (NVML gave none)."""
        if not isinstance(raw, list):
            return None
        out = []
        for p in raw[:MAX_ENTRIES]:
            if not isinstance(p, Mapping):
                continue
            pid, used = as_int(p.get("pid")), as_bytes(p.get("used_bytes"))
            if pid is not None and used is not None:
                out.append(cls(pid, as_text(p.get("name")), used, p.get("self") is True))
        return tuple(out)


@dataclass(frozen=True)
class DeviceLimits:
    """``cudaLimit`` values (bytes; stack is per thread)."""

    stack_size: int | None = None
    malloc_heap_size: int | None = None
    printf_fifo_size: int | None = None

    @classmethod
    def from_extra(cls, d: Any) -> DeviceLimits:
        """``device_limits``, an ``oom_states`` entry's ``limits``, or the ``budget`` (same keys)."""
        if not isinstance(d, Mapping):
            return cls()
        return cls(as_bytes(d.get("stack_size")), as_bytes(d.get("malloc_heap_size")),
                   as_bytes(d.get("printf_fifo_size")))


@dataclass(frozen=True)
class OOMState:
    """The device measured when one ``oom`` row was raised (an ``oom_states`` entry)."""

    seq: int
    device: int | None = None
    mem_free: int | None = None
    mem_total: int | None = None
    processes: tuple[ProcessUse, ...] | None = None  # None: NVML gave no list
    limits: DeviceLimits = DeviceLimits()
    pool_used: int | None = None
    pool_total: int | None = None
    pool_limit: int | None = None  # None: no limit (0 reads as none)

    @property
    def self_used(self) -> int | None:
        own = [p.used for p in self.processes or () if p.is_self]
        return sum(own) if own else None

    @property
    def others(self) -> tuple[ProcessUse, ...]:
        return tuple(p for p in self.processes or () if not p.is_self)

    @classmethod
    def from_extra(cls, d: Any) -> OOMState | None:
        """One entry; None where it is not an object or has no usable ``seq``."""
        if not isinstance(d, Mapping):
            return None
        seq = as_int(d.get("seq"))
        if seq is None:
            return None
        pool = _mapping(d.get("pool"))
        return cls(
            seq=seq, device=as_int(d.get("device")), mem_free=as_bytes(d.get("mem_free")),
            mem_total=as_bytes(d.get("mem_total")), processes=ProcessUse.list_from_extra(d.get("processes")),
            limits=DeviceLimits.from_extra(d.get("limits")), pool_used=as_bytes(pool.get("used_bytes")),
            pool_total=as_bytes(pool.get("total_bytes")),
            pool_limit=as_bytes(pool.get("limit_bytes")) or None,
        )


@dataclass(frozen=True)
class OOMEntry:
    """One ``ooms`` entry: the OOM as the recorder's hook saw it (version 1 names the fatal one by
    its ``message``)."""

    seq: int
    message: str | None = None
    exception: str | None = None
    device: int | None = None
    size: int | None = None
    rounded: int | None = None
    pool_id: int | None = None

    @classmethod
    def from_extra(cls, d: Any) -> OOMEntry | None:
        """One entry; None where it is not an object or has no usable ``seq``."""
        if not isinstance(d, Mapping):
            return None
        seq = as_int(d.get("seq"))
        if seq is None:
            return None
        return cls(seq, as_text(d.get("message")), as_text(d.get("exception")), as_int(d.get("device")),
                   as_bytes(d.get("size")), as_bytes(d.get("rounded")), as_int(d.get("pool_id")))


class PoolKind(StrEnum):
    """What a pool is (``pools[].kind``)."""

    POOL = "pool"  # a CuPy MemoryPool (or PyTorch's caching allocator)
    ASYNC = "async"  # a CuPy MemoryAsyncPool: stream-ordered, device-level
    CUDA = "cuda"  # plain device allocations


DEFAULT_POOL_LABEL = "default"  # ``pools[].label`` of CuPy's default pool on each device (the recorder's)
TORCH_POOL_LABEL = "caching allocator"  # ``pools[].label`` of PyTorch's allocator on each device
# The labels of a device's own allocator, not a pool the program made (``outcome.default_pool``).
DEFAULT_LABELS = frozenset({DEFAULT_POOL_LABEL, TORCH_POOL_LABEL})


@dataclass(frozen=True)
class PoolInfo:
    """One ``pools`` entry: an allocator pool of a device (``id``: the ``pool`` column's value)."""

    id: int
    device: int
    kind: str | None = None
    label: str | None = None
    limit_bytes: int | None = None  # as recorded; 0 is CuPy's "no limit"

    @property
    def limit(self) -> int | None:
        """The pool's limit; None where it has none (or it is not known: ``limit_known``)."""
        return self.limit_bytes if self.limit_bytes is not None and self.limit_bytes > 0 else None

    @property
    def limit_known(self) -> bool:
        """Whether the entry says the pool's limit: the recorder writes an entry with none when it
        first sees the pool and reads the limit at the program's normal end (CuPy: 0 for none), so
        a recording that was killed has entries that do not say it."""
        return self.limit_bytes is not None

    @classmethod
    def from_extra(cls, d: Any) -> PoolInfo | None:
        """One entry; None where it is not an object or lacks a usable ``device`` or ``id``."""
        if not isinstance(d, Mapping):
            return None
        dev, pid = as_int(d.get("device")), as_int(d.get("id"))
        if dev is None or pid is None:
            return None
        return cls(pid, dev, as_text(d.get("kind")), as_text(d.get("label")), as_bytes(d.get("limit_bytes")))


@dataclass(frozen=True)
class PoolEnd:
    """One ``pools_end`` entry: a pool's own counters at the end of the recording."""

    used_bytes: int | None = None
    total_bytes: int | None = None
    limit_bytes: int | None = None
    free_bytes: int | None = None
    n_free_blocks: int | None = None

    @classmethod
    def from_extra(cls, d: Any) -> PoolEnd | None:
        """One entry; None for a pool the program had dropped (null) or an entry that is not an object."""
        if not isinstance(d, Mapping):
            return None
        return cls(as_bytes(d.get("used_bytes")), as_bytes(d.get("total_bytes")),
                   as_bytes(d.get("limit_bytes")), as_bytes(d.get("free_bytes")),
                   as_bytes(d.get("n_free_blocks")))


@dataclass(frozen=True)
class Budget:
    """The device budget the recorder stored at the start (``budget``; ``docs/budget.md``)."""

    device: int | None = None
    others: tuple[ProcessUse, ...] | None = None  # ``other_processes``; None: no list
    others_bytes: int | None = None  # ``other_processes_bytes``: NVML used before this process
    context: int | None = None  # ``context_bytes``
    limits: DeviceLimits = DeviceLimits()
    sm_count: int | None = None
    threads_per_sm: int | None = None  # ``max_threads_per_sm``
    pool_total: int | None = None  # ``cupy_pool_total_bytes``
    pool_used: int | None = None  # ``cupy_pool_used_bytes``
    terms: tuple[tuple[str, int], ...] = ()  # every key with an integer value (``optional_int``), in order

    @classmethod
    def from_extra(cls, raw: Any) -> Budget:
        if not isinstance(raw, Mapping):
            return cls()
        procs = raw.get("other_processes")
        others = None
        if isinstance(procs, list):
            others = tuple(
                ProcessUse(as_int(p.get("pid")) or 0, as_text(p.get("name")),
                           as_bytes(p.get("bytes", p.get("used_bytes"))) or 0, False)
                for p in procs[:MAX_ENTRIES] if isinstance(p, Mapping) and as_int(p.get("pid")) is not None)
        terms = [(str(k), optional_int(v)) for k, v in raw.items()]
        return cls(
            device=as_int(raw.get("device")), others=others,
            others_bytes=as_bytes(raw.get("other_processes_bytes")),
            context=as_bytes(raw.get("context_bytes")), limits=DeviceLimits.from_extra(raw),
            sm_count=as_bytes(raw.get("sm_count")),
            threads_per_sm=as_bytes(raw.get("max_threads_per_sm")),
            pool_total=as_bytes(raw.get("cupy_pool_total_bytes")),
            pool_used=as_bytes(raw.get("cupy_pool_used_bytes")),
            terms=tuple((k, v) for k, v in terms if v is not None),
        )


@dataclass(frozen=True)
class ExitInfo:
    """How the recorded program ended (``exit``). ``oom_seq``: the OOM whose error ended it (v2)."""

    status: str | None = None
    exception: str | None = None
    code: int | None = None
    oom_seq: int | None = None
    message: str | None = None

    @property
    def survived(self) -> bool:
        """The program ended normally, by a signal, or by an exception that is not an OOM."""
        if self.status in ("ok", "signal"):
            return True
        if self.exception is None:
            return self.code == 0 or self.status is not None
        return not self.oom_exception

    @property
    def oom_exception(self) -> bool:
        text = f"{self.exception or ''} {self.message or ''}".lower()
        return "outofmemory" in text.replace(" ", "") or "out of memory" in text

    @classmethod
    def from_extra(cls, d: Any) -> ExitInfo | None:
        """None where the trace has no ``exit`` object."""
        if not isinstance(d, Mapping):
            return None
        return cls(as_text(d.get("status")), as_text(d.get("exception")), as_int(d.get("code")),
                   as_int(d.get("oom_seq")), as_text(d.get("message")))


@dataclass(frozen=True)
class StackSettings:
    """How call stacks were recorded: ``recorder.call_sites``, ``recorder.stack_depth`` (frames per
    stack, 0: none) and the folders call-site paths are relative to (``sites_relative_to``)."""

    call_sites: bool | None = None
    stack_depth: int | None = None
    relative_to: tuple[str, ...] = ()

    @classmethod
    def from_extra(cls, recorder: Any, relative_to: Any) -> StackSettings:
        r = _mapping(recorder)
        sites = r.get("call_sites")
        folders = relative_to[:MAX_ENTRIES] if isinstance(relative_to, list) else ()
        depth = as_int(r.get("stack_depth"))
        return cls(sites if isinstance(sites, bool) else None,
                   depth if depth is not None and depth >= 0 else None,
                   tuple(f for f in folders if isinstance(f, str)))


@dataclass(frozen=True)
class RmmPoolSettings:
    """The RMM pool a recorded program set up (``rmm_record.pool``, ``record --rmm``): its size when
    logging started (the initial pool) and its maximum, bytes; None where not known."""

    initial_bytes: int | None = None
    maximum_bytes: int | None = None

    @classmethod
    def from_extra(cls, d: Any) -> RmmPoolSettings:
        pool = d.get("pool") if isinstance(d, Mapping) else None
        if not isinstance(pool, Mapping):
            return cls()
        return cls(as_bytes(pool.get("initial_bytes")), as_bytes(pool.get("maximum_bytes")))


def truthy(v: Any) -> bool:
    """A JSON flag: true, or "true"/"1"/"yes" as text (any case, spaces around)."""
    return v is True or (isinstance(v, str) and v.strip().lower() in ("true", "1", "yes"))


@dataclass(frozen=True)
class TorchSettings:
    """PyTorch's caching-allocator settings the run had (``torch_allocator_settings``: the recorder's
    ``allocator_settings`` snapshot or an imported snapshot's, keys as PyTorch names them, plus the
    recorder's ``PYTORCH_CUDA_ALLOC_CONF`` text). ``raw`` is the mapping as written (None: no such
    key, or not a mapping): ``sim.torch_rules.options_from_snapshot`` turns it into options and an
    export writes it back as it is."""

    raw: Mapping[str, Any] | None = None

    @classmethod
    def from_extra(cls, d: Any) -> TorchSettings:
        return cls(d if isinstance(d, Mapping) else None)

    @property
    def snapshot(self) -> Mapping[str, Any]:
        """``raw``, or an empty mapping (PyTorch's defaults) where there is none."""
        return self.raw if self.raw is not None else {}

    @property
    def alloc_conf(self) -> str | None:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` text the program ran under; None: unset or blank."""
        text = self.snapshot.get("PYTORCH_CUDA_ALLOC_CONF")
        return text if isinstance(text, str) and text.strip() else None

    @property
    def gc_threshold(self) -> float:
        """``garbage_collection_threshold`` (a fraction of the limit, strictly between 0 and 1);
        0.0: none, or not a usable number."""
        value = self.snapshot.get("garbage_collection_threshold")
        return float(value) if isinstance(value, int | float) and 0.0 < value < 1.0 else 0.0

    @property
    def expandable_segments(self) -> bool:
        """Whether the run had expandable segments (a boolean, or "true"/"1"/"yes" as text)."""
        return truthy(self.snapshot.get("expandable_segments"))


@dataclass(frozen=True)
class RerunCommand:
    """How the recorded program was started (``rerun``, written by ``record``): its arguments
    (``python ARGV...``; with ``module``, ``python -m ARGV...``), the folder it ran in (None: not
    said) and the ``record --limit`` it ran under (bytes; None: none)."""

    argv: tuple[str, ...]
    module: bool = False
    cwd: str | None = None
    limit_bytes: int | None = None

    @classmethod
    def from_extra(cls, d: Any) -> RerunCommand | None:
        """None where there is no argument list to run."""
        if not isinstance(d, Mapping):
            return None
        argv = d.get("argv")
        if not isinstance(argv, list) or not argv:
            return None
        cwd = d.get("cwd")
        limit = as_bytes(d.get("limit_bytes"))
        return cls(tuple(str(a) for a in argv), bool(d.get("module")),
                   str(cwd) if cwd else None, limit or None)


@dataclass(frozen=True)
class RecordedMeta:
    """Every recorder key a verb reads, typed (see the module docstring). ``oom_states`` by seq (the
    last entry wins for a repeated seq); ``pool_limits`` by (device, pool id), None where the pool has
    no limit (the last entry wins likewise)."""

    device_id: int | None = None
    ooms: tuple[OOMEntry, ...] = ()
    oom_states: Mapping[int, OOMState] = field(default_factory=dict)
    pools: tuple[PoolInfo, ...] = ()
    pools_end: tuple[PoolEnd | None, ...] = ()
    budget: Budget = Budget()
    device_limits: DeviceLimits = DeviceLimits()
    exit: ExitInfo | None = None
    stacks: StackSettings = StackSettings()
    pool_limits: Mapping[tuple[int, int], int | None] = field(default_factory=dict)
    rmm_pool: RmmPoolSettings = RmmPoolSettings()
    torch_settings: TorchSettings = TorchSettings()
    rerun: RerunCommand | None = None

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> RecordedMeta:
        ooms, states, pools, ends = (extra.get(k) for k in ("ooms", "oom_states", "pools", "pools_end"))
        entries = (OOMEntry.from_extra(o) for o in ooms[:MAX_STATES]) if isinstance(ooms, list) else ()
        measured = (OOMState.from_extra(s) for s in states[:MAX_STATES]) if isinstance(states, list) else ()
        table = tuple(p for p in (PoolInfo.from_extra(p) for p in pools[:MAX_ENTRIES]) if p is not None) \
            if isinstance(pools, list) else ()
        return cls(
            device_id=as_int(extra.get("device_id")),
            ooms=tuple(o for o in entries if o is not None),
            oom_states={s.seq: s for s in measured if s is not None},
            pools=table,
            pools_end=tuple(map(PoolEnd.from_extra, ends[:MAX_ENTRIES])) if isinstance(ends, list) else (),
            budget=Budget.from_extra(extra.get("budget")),
            device_limits=DeviceLimits.from_extra(extra.get("device_limits")),
            exit=ExitInfo.from_extra(extra.get("exit")),
            stacks=StackSettings.from_extra(extra.get("recorder"), extra.get("sites_relative_to")),
            pool_limits={(p.device, p.id): p.limit for p in table},
            rmm_pool=RmmPoolSettings.from_extra(extra.get("rmm_record")),
            torch_settings=TorchSettings.from_extra(extra.get(TORCH_SETTINGS_KEY)),
            rerun=RerunCommand.from_extra(extra.get("rerun")),
        )

    @classmethod
    def of(cls, recorded: RecordedMeta | Mapping[str, Any]) -> RecordedMeta:
        """``recorded`` itself, or parsed from a raw ``extra`` mapping (callers that hold only that)."""
        return recorded if isinstance(recorded, RecordedMeta) else cls.from_extra(recorded)

    def home_device(self, devices: list[int]) -> int | None:
        """The device the start metadata (``device_id``, else the ``budget``'s ``device``) describes,
        else the first of ``devices``."""
        for v in (self.device_id, self.budget.device):
            if v is not None:
                return v
        return devices[0] if devices else None
