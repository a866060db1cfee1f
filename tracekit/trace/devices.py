"""One device at a time: the devices a trace's events are on, and one device's events alone.

Every device has its own memory, pools, limits and address space, so a trace recorded on
several GPUs is never analyzed or replayed as one device: ``select_device`` cuts out one
device's events (with their malloc/free and segment pairing re-indexed and the extra
columns filtered alike), and ``single_device`` refuses a mixed trace in one sentence
where a stage models one device only (``replay --sim``).

One pool at a time, likewise (``select_pool``): CuPy's pools never share memory and each
``MemoryPool`` has its own limit, so one pool's rows replayed alone under its limit model it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.parquet as pq

from tracekit.errors import InputError
from tracekit.trace.arrow import array_of, filled
from tracekit.trace.outcome import default_pool
from tracekit.trace.reader import Trace
from tracekit.trace.schema import TraceMeta
from tracekit.trace.validate import remap_mate


def device_ids(trace: Trace) -> list[int]:
    """The distinct device ordinals of the events, ascending (empty for an empty trace)."""
    dev = trace.events.device
    if len(dev) == 0:
        return []
    lo, hi = int(dev.min()), int(dev.max())
    return [lo] if lo == hi else [int(d) for d in np.unique(dev)]  # the sort only for a mixed trace


def select_device(trace: Trace, device: int) -> Trace:
    """The events of ``device`` only, in order, paired among themselves.

    A malloc and its free are always on one device (the reader pairs by device and
    address), so no pair is cut; the result keeps ``meta``, ``path`` and ``issues``.
    """
    return _rows(trace, trace.events.device == device)


def _rows(trace: Trace, keep: np.ndarray, meta: TraceMeta | None = None) -> Trace:
    """``trace``'s rows where ``keep``, paired among themselves, the extra columns filtered alike;
    ``meta`` in place of its metadata where given; ``trace`` itself where nothing changes."""
    meta = trace.meta if meta is None else meta
    if keep.all():
        return trace if meta is trace.meta else dataclasses.replace(trace, meta=meta)
    extras = trace.extras.filter(array_of(keep, pa.bool_())) if trace.extras is not None else None
    return dataclasses.replace(trace, events=trace.events.take(keep), mate=remap_mate(trace.mate, keep),
                               extras=extras, meta=meta)


def marks_pools(trace: Trace) -> bool:
    """Whether the trace has a ``pool`` column that can say a row's pool (one of Arrow's null type
    holds none)."""
    tbl = trace.extras
    return (tbl is not None and "pool" in tbl.column_names
            and not pa.types.is_null(tbl.schema.field("pool").type))


def pool_ids(trace: Trace) -> np.ndarray:
    """The pool of each event (int64): the ``pool`` extra column, 0 (the default pool, as the recorder
    numbers it) where a row has none or the trace has no such column (``marks_pools``)."""
    if not marks_pools(trace):
        return np.zeros(len(trace.events), np.int64)
    assert trace.extras is not None
    return filled(trace.extras.column("pool"), 0).astype(np.int64, copy=False)


def select_pool(trace: Trace, pool: int) -> Trace:
    """The events of pool ``pool`` only (``pool_ids``), in order, paired among themselves, and metadata
    that describes that pool alone: its ``pools`` entry (and its ``pools_end`` one) is the only one, so
    every reader takes it for its device's one pool, whose limit is the pool's own (``outcome.held_limit``
    then reads the limit measured at its failing request: the counterfactual input judges its releases
    by it). ``pool_limit_bytes``, the default pool's limit at the start, is kept only where ``pool`` is
    that default pool (``outcome.default_pool``).

    A malloc and its free, a segment's allocation and its release, are always in one pool, so no
    pair is cut; ``path`` and ``issues`` are kept.
    """
    return _rows(trace, pool_ids(trace) == pool, _one_pool(trace.meta, pool))


def only_pool(trace: Trace, pool: int) -> Trace:
    """``select_pool`` for a pool the user named (``--pool``): one sentence naming the file and the
    pools it has where ``pool`` has no events in it, or that it marks none (no ``pool`` column)."""
    where = trace.path or "the trace"
    if not marks_pools(trace):
        raise InputError(_no_pools(where))
    ids = pool_ids(trace)
    if not (ids == pool).any():
        raise InputError(_no_such_pool(where, trace.meta, pool, np.unique(ids)))
    return select_pool(trace, pool)


def pool_device_file(path: str | os.PathLike[str], pool: int) -> int:
    """The device of pool ``pool``'s events in the trace file at ``path``, from its ``pool`` and
    ``device`` columns alone (a pool id counts (pool, device) pairs, so they are one device's); one
    sentence naming the file where it marks no pools or none of its events are that pool's (as
    ``only_pool``). Files that cannot be read this way are left for the full reader to reject."""
    from tracekit.trace.reader import close_parquet, open_parquet, read_meta

    _, pf = open_parquet(path)
    try:
        if "pool" not in pf.schema_arrow.names or pa.types.is_null(pf.schema_arrow.field("pool").type):
            raise InputError(_no_pools(path))
        tbl = pf.read(columns=["pool", "device"])
    except (OSError, ValueError, KeyError, pa.ArrowException):
        return 0
    finally:
        close_parquet(pf)
    ids = filled(tbl.column("pool"), 0).astype(np.int64, copy=False)
    rows = np.flatnonzero(ids == pool)
    if not len(rows):
        raise InputError(_no_such_pool(path, read_meta(path), pool, np.unique(ids)))
    return int(filled(tbl.column("device"), 0)[rows[0]])


def _no_pools(where: object) -> str:
    return (f"{where}: no pools are marked there (no pool column: tracekit record marks CuPy's pools), "
            "so --pool cannot pick one")


def _no_such_pool(where: object, meta: TraceMeta, pool: int, present: np.ndarray) -> str:
    listed = ", ".join(_describe_pool(meta, int(p)) for p in present) or "none (no events)"
    return f"{where}: pool {pool} has no events there; its pools: {listed}"


def _describe_pool(meta: TraceMeta, pool: int) -> str:
    """``pool``'s id and the label its ``pools`` entry gives it (``1 ('user 1')``), the id alone without."""
    label = next((p.label for p in meta.recorded.pools if p.id == pool and p.label is not None), None)
    return f"{pool} ({label!r})" if label is not None else str(pool)


def _one_pool(meta: TraceMeta, pool: int) -> TraceMeta:
    """``meta`` with ``pool``'s ``pools`` entry alone (``pools_end`` alike where it has one entry per
    pool); written from the parsed entries, whose fields are the format's keys."""
    recorded = meta.recorded
    kept = [i for i, p in enumerate(recorded.pools) if p.id == pool]
    ends = recorded.pools_end if len(recorded.pools_end) == len(recorded.pools) else None
    extra: dict[str, object] = {**meta.extra, "pools": [dataclasses.asdict(recorded.pools[i]) for i in kept]}
    if ends is not None:
        extra["pools_end"] = [None if (e := ends[i]) is None else dataclasses.asdict(e) for i in kept]
    else:
        extra.pop("pools_end", None)  # not one entry per pool: which is this pool's cannot be told
    # the default pool (``outcome.default_pool``); without an entry, 0 (the recorder's number for it)
    default = any(getattr(default_pool(recorded, recorded.pools[i].device), "id", None) == pool
                  for i in kept) if kept else pool == 0
    return dataclasses.replace(meta, extra=extra, pool_limit_bytes=meta.pool_limit_bytes if default else None)


def single_device(trace: Trace, what: str) -> Trace:
    """``trace`` itself when its events are on at most one device; else InputError naming them.

    ``what`` names the stage that models one device (e.g. "a simulated replay").
    """
    devs = device_ids(trace)
    if len(devs) <= 1:
        return trace
    raise InputError(_mixed(trace.path if trace.path is not None else "the trace", devs, what))


def require_single_device_file(path: str | os.PathLike[str], what: str) -> int | None:
    """``single_device`` for a trace file, from its ``device`` column's statistics where they say
    one device (nothing read), else from that column alone (cheap); the one device, None where the
    file has no events or cannot be read this way (left for the full reader to reject)."""
    from tracekit.trace.reader import close_parquet, open_parquet  # the input policy

    _, pf = open_parquet(path)
    try:
        devs = _one_device_by_statistics(pf)
        if devs is None:
            import pyarrow.compute as pc

            col = pf.read(columns=["device"]).column(0)
            devs = sorted(int(d) for d in pc.unique(col).to_pylist() if d is not None)
    except (OSError, ValueError, KeyError, IndexError, pa.ArrowException):
        return None
    finally:
        close_parquet(pf)
    if len(devs) > 1:
        raise InputError(_mixed(path, devs, what))
    return devs[0] if devs else None


def _one_device_by_statistics(pf: pq.ParquetFile) -> list[int] | None:
    """The one device every row group's statistics name (min = max, the same in each), [] for a
    file of no rows, None where the statistics cannot say (absent, or more than one value)."""
    md = pf.metadata
    seen: set[int] = set()
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        if group.num_rows == 0:
            continue
        col = next((group.column(c) for c in range(group.num_columns)
                    if group.column(c).path_in_schema == "device"), None)
        st = col.statistics if col is not None else None
        if st is None:
            return None
        if st.null_count == group.num_rows:
            continue  # no device named here (nulls are not devices)
        if not st.has_min_max or st.min != st.max:
            return None
        seen.add(int(st.min))
    return sorted(seen) if len(seen) <= 1 else None


def _mixed(where: object, devs: list[int], what: str) -> str:
    return (
        f"{where}: the events are on {len(devs)} devices ({', '.join(map(str, devs))}), and {what} "
        "models one device's allocator; devices are never merged into one address space (analyze, "
        "whatif and report treat each device on its own)"
    )


def split_devices(trace: Trace) -> list[tuple[int, Trace]]:
    """Every device's events alone (as ``select_device``), in device order, in O(n) overall.

    One stable sort by device and one position-within-device map serve every device, so a
    trace of many devices costs no more than one of two.
    """
    dev = trace.events.device
    devs = device_ids(trace)
    if len(devs) <= 1:
        return [(d, trace) for d in devs]
    order = np.argsort(dev, kind="stable")
    starts = np.searchsorted(dev[order], np.array(devs, dev.dtype))
    ends = np.r_[starts[1:], len(order)]
    local = np.empty(len(dev), np.int64)
    local[order] = np.arange(len(order)) - np.repeat(starts, ends - starts)
    out = []
    for d, a, b in zip(devs, starts, ends, strict=True):
        idx = order[a:b]  # increasing: the sort is stable
        m = trace.mate[idx]
        mate = np.where(m >= 0, local[np.maximum(m, 0)], -1).astype(np.int64)
        extras = trace.extras.take(array_of(idx, pa.int64())) if trace.extras is not None else None
        out.append((d, dataclasses.replace(trace, events=trace.events.take(idx), mate=mate, extras=extras)))
    return out
