"""What the recorder measured beyond the events, read defensively from trace metadata.

Trace format version 2 stores the device at every OOM (``oom_states``: cudaMemGetInfo,
NVML per-process used bytes, the ``cudaLimit`` values, the pool's counters), how the
program ended (``exit``), the pools (``pools``) and a ``device_free`` column measured at
device-level rows. Version 1 recordings stored less: an ``exit`` object with the
exception and its message and an ``ooms`` list of pool counters. Imported PyTorch
snapshots carry ``torch_oom_observer``. Every figure here is bytes, exact, and None when
the recording does not have it or holds something malformed: analysis never fails on
metadata it cannot use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracekit.trace.outcome import MAX_STATES, as_int, as_text
from tracekit.trace.reader import Trace


def as_bytes(v: Any) -> int | None:
    """A byte count: an exact integer ≥ 0, else None."""
    n = as_int(v)
    return n if n is not None and n >= 0 else None


@dataclass(frozen=True)
class ProcessUse:
    """One process's used device memory as NVML reported it."""

    pid: int
    name: str | None
    used: int
    is_self: bool

    def label(self) -> str:
        return f"process {self.pid}" + (f" ({self.name})" if self.name else "")


@dataclass(frozen=True)
class DeviceLimits:
    """``cudaLimit`` values (bytes; stack is per thread)."""

    stack_size: int | None = None
    malloc_heap_size: int | None = None
    printf_fifo_size: int | None = None

    @classmethod
    def from_dict(cls, d: Any) -> DeviceLimits:
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
    pool_limit: int | None = None

    @property
    def self_used(self) -> int | None:
        own = [p.used for p in self.processes or () if p.is_self]
        return sum(own) if own else None

    @property
    def others(self) -> tuple[ProcessUse, ...]:
        return tuple(p for p in self.processes or () if not p.is_self)


def _processes(raw: Any) -> tuple[ProcessUse, ...] | None:
    if not isinstance(raw, list):
        return None
    out = []
    for p in raw[:4096]:
        if not isinstance(p, Mapping):
            continue
        pid, used = as_int(p.get("pid")), as_bytes(p.get("used_bytes"))
        if pid is not None and used is not None:
            out.append(ProcessUse(pid, as_text(p.get("name")), used, p.get("self") is True))
    return tuple(out)


def _state(d: Any) -> OOMState | None:
    if not isinstance(d, Mapping) or as_int(d.get("seq")) is None:
        return None
    raw = d.get("pool")
    pool: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    limit = as_bytes(pool.get("limit_bytes"))
    return OOMState(
        seq=as_int(d["seq"]) or 0, device=as_int(d.get("device")), mem_free=as_bytes(d.get("mem_free")),
        mem_total=as_bytes(d.get("mem_total")), processes=_processes(d.get("processes")),
        limits=DeviceLimits.from_dict(d.get("limits")), pool_used=as_bytes(pool.get("used_bytes")),
        pool_total=as_bytes(pool.get("total_bytes")), pool_limit=limit or None,
    )


def oom_states(extra: Mapping[str, Any]) -> dict[int, OOMState]:
    """``oom_states`` by seq (the last entry wins for a repeated seq)."""
    raw = extra.get("oom_states")
    if not isinstance(raw, list):
        return {}
    states = (_state(d) for d in raw[:MAX_STATES])
    return {s.seq: s for s in states if s is not None}


def pool_limits(extra: Mapping[str, Any]) -> dict[tuple[int, int], int | None]:
    """Every ``pools`` entry's limit by (device, pool id); None where the pool has no limit."""
    raw = extra.get("pools")
    out: dict[tuple[int, int], int | None] = {}
    if not isinstance(raw, list):
        return out
    for p in raw[:4096]:
        if not isinstance(p, Mapping):
            continue
        dev, pid, lim = as_int(p.get("device")), as_int(p.get("id")), as_bytes(p.get("limit_bytes"))
        if dev is not None and pid is not None:
            out[(dev, pid)] = lim if lim is not None and lim > 0 else None
    return out


def home_device(extra: Mapping[str, Any], devices: list[int]) -> int | None:
    """The device the start metadata (``device``, ``budget``) describes."""
    budget = extra.get("budget")
    for v in (extra.get("device_id"), budget.get("device") if isinstance(budget, Mapping) else None):
        if as_int(v) is not None:
            return as_int(v)
    return devices[0] if devices else None


def extra_column(trace: Trace, name: str) -> np.ndarray | None:
    """An extra integer column aligned with ``trace.events`` as int64 (-1 = null), or None.

    Taken from ``trace.extras`` when the trace was read with them, else read from the
    file (that one column and ``seq``) and aligned by seq, since the reader may have
    dropped inconsistent rows.
    """
    tbl = trace.extras
    if tbl is not None and name in tbl.column_names:
        return _ints(tbl.column(name))
    if tbl is not None or trace.path is None:
        return None
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(trace.path)
        if name not in pf.schema_arrow.names:
            return None
        t = pf.read(columns=["seq", name])
    except (OSError, ValueError):
        return None
    vals = _ints(t.column(name))
    if vals is None:
        return None
    seq = t.column("seq").to_numpy()
    if len(seq) == len(trace.events):
        return vals
    return vals[np.searchsorted(seq, trace.events.seq)]


def _ints(col: Any) -> np.ndarray | None:
    import pyarrow as pa

    if not pa.types.is_integer(col.type):
        return None
    col = col.cast(pa.int64(), safe=False)  # uint64 values beyond int64 become negative: unknown
    vals = np.asarray(col.fill_null(-1).to_numpy(), dtype=np.int64)
    return np.where(vals < 0, -1, vals)


@dataclass(frozen=True)
class StartState:
    """The device when recording began, from the ``budget`` the recorder stored (bytes)."""

    total: int | None = None
    free: int | None = None
    others: tuple[ProcessUse, ...] | None = None  # NVML's listed processes; None: no list
    others_bytes: int | None = None  # NVML used before this process (listed or not)
    context: int | None = None
    limits: DeviceLimits = DeviceLimits()
    sm_count: int | None = None
    threads_per_sm: int | None = None
    pool_total: int | None = None
    pool_used: int | None = None

    @property
    def threads(self) -> int | None:
        """Threads the device can hold at once: SM count × max resident threads per SM."""
        if self.sm_count is None or self.threads_per_sm is None:
            return None
        return self.sm_count * self.threads_per_sm


def start_state(extra: Mapping[str, Any], total: int | None, free: int | None) -> StartState:
    """``total``/``free``: the device's CUDA total and free at start as the context read them."""
    b = extra.get("budget")
    b = b if isinstance(b, Mapping) else {}
    raw = b.get("other_processes")
    others = None
    if isinstance(raw, list):
        others = tuple(
            ProcessUse(as_int(p.get("pid")) or 0, as_text(p.get("name")),
                       as_bytes(p.get("bytes", p.get("used_bytes"))) or 0, False)
            for p in raw[:4096] if isinstance(p, Mapping) and as_int(p.get("pid")) is not None)
    limits = DeviceLimits.from_dict(b)
    if limits == DeviceLimits():
        limits = DeviceLimits.from_dict(extra.get("device_limits"))
    return StartState(
        total=total, free=free, others=others, others_bytes=as_bytes(b.get("other_processes_bytes")),
        context=as_bytes(b.get("context_bytes")), limits=limits, sm_count=as_bytes(b.get("sm_count")),
        threads_per_sm=as_bytes(b.get("max_threads_per_sm")),
        pool_total=as_bytes(b.get("cupy_pool_total_bytes")),
        pool_used=as_bytes(b.get("cupy_pool_used_bytes")),
    )
