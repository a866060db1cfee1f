"""What the recorder measured beyond the events: the device at the start and the extra columns.

The metadata keys (``oom_states``, ``pools``, ``budget``, ``device_limits``, ...) are typed once by
``tracekit.trace.recorded`` (``TraceMeta.recorded``); this module builds on them the start state an
analysis needs (``StartState``: the ``budget`` with the context's CUDA total and free) and reads the
integer extra columns (``device_free``, ``pool``). Trace format version 2 stores the device at every
OOM (``oom_states``: cudaMemGetInfo, NVML per-process used bytes, the ``cudaLimit`` values, the
pool's counters), how the program ended (``exit``), the pools (``pools``) and a ``device_free``
column measured at device-level rows. Version 1 recordings stored less: an ``exit`` object with the
exception and its message and an ``ooms`` list of pool counters. Every figure here is bytes, exact,
and None when the recording does not have it or holds something malformed: analysis never fails on
metadata it cannot use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracekit.trace.arrow import filled
from tracekit.trace.reader import Trace
from tracekit.trace.recorded import (
    DeviceLimits,
    OOMState,
    ProcessUse,
    RecordedMeta,
    as_bytes,
)

__all__ = ["DeviceLimits", "OOMState", "ProcessUse", "StartState", "as_bytes", "extra_column",
           "oom_states", "pool_limits", "start_state"]


def oom_states(recorded: RecordedMeta | Mapping[str, Any]) -> Mapping[int, OOMState]:
    """``oom_states`` by seq (the last entry wins for a repeated seq)."""
    return RecordedMeta.of(recorded).oom_states


def pool_limits(recorded: RecordedMeta | Mapping[str, Any]) -> Mapping[tuple[int, int], int | None]:
    """Every ``pools`` entry's limit by (device, pool id); None where the pool has no limit."""
    return RecordedMeta.of(recorded).pool_limits


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
    seq = filled(t.column("seq"))
    if len(seq) == len(trace.events):
        return vals
    return vals[np.searchsorted(seq, trace.events.seq)]


def _ints(col: Any) -> np.ndarray | None:
    import pyarrow as pa

    if not pa.types.is_integer(col.type):
        return None
    col = col.cast(pa.int64(), safe=False)  # uint64 values beyond int64 become negative: unknown
    vals = filled(col, -1).astype(np.int64, copy=False)
    return np.where(vals < 0, -1, vals)


@dataclass(frozen=True)
class StartState:
    """The device when recording began, from the ``budget`` the recorder stored (bytes)."""

    total: int | None = None
    free: int | None = None
    others: tuple[ProcessUse, ...] | None = None  # NVML's listed processes; None: no list
    others_bytes: int | None = None  # NVML used before this process (listed or not)
    context: int | None = None
    limits: DeviceLimits = field(default_factory=DeviceLimits)
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


def start_state(recorded: RecordedMeta | Mapping[str, Any], total: int | None,
                free: int | None) -> StartState:
    """``total``/``free``: the device's CUDA total and free at start as the context read them."""
    r = RecordedMeta.of(recorded)
    b = r.budget
    limits = b.limits if b.limits != DeviceLimits() else r.device_limits
    return StartState(
        total=total, free=free, others=b.others, others_bytes=b.others_bytes, context=b.context,
        limits=limits, sm_count=b.sm_count, threads_per_sm=b.threads_per_sm, pool_total=b.pool_total,
        pool_used=b.pool_used,
    )
