"""Import a PyTorch CUDA memory snapshot (``_dump_snapshot`` pickle) as a v1 trace.

Mapping, per history entry: ``alloc`` -> ``malloc`` (``size`` = the unrounded
request, ``rounded`` = ``round_size(size)`` under the snapshot's
``roundup_power2_divisions``); ``free_completed`` -> ``free`` (``size`` = the
paired malloc's ``rounded``; the time of the matching ``free_requested`` goes
to the extra column ``free_requested_ns``); ``segment_alloc`` /
``segment_free`` -> segment rows; ``segment_map`` / ``segment_unmap`` -> one
segment row per cell of the device's expandable grid (``torch_state``);
``oom`` -> ``oom`` (``size`` = ``rounded`` = PyTorch's rounded request, extra
``device_free``); ``time_us`` -> ``t_ns`` = 1000 (time_us - first time_us);
frames -> ``site`` (the call-site) and ``stack`` (the whole stack,
``torch_stacks``). ``free_requested`` makes no row; other actions are skipped
and counted. The state before the first entry is emitted first, at t_ns 0,
with ``initial`` = true. Metadata: source torch, device and pool limit when
the snapshot carries a ``tracekit`` key (written by ``record --torch`` and
``scripts/torch_workloads.py``), ``torch_allocator_settings``, ``torch_import``.
"""

from __future__ import annotations

import gzip
import mmap
import os
import zlib
from collections import Counter
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.errors import InputError
from tracekit.importers import snapshot_policy as policy
from tracekit.importers import torch_columns as tc
from tracekit.importers.pickle_scan import EntryList, scan
from tracekit.importers.safe_pickle import GZIP_MAGIC, UNPICKLE_PER_BYTE, load_pickle
from tracekit.importers.torch_stacks import StackBuilder
from tracekit.importers.torch_state import FinalState, Grid, Rows, final_state, initial_rows
from tracekit.inputs import check_regular, optional_int
from tracekit.outputs import check_output
from tracekit.progress import LARGE_BYTES, Progress
from tracekit.sim.torch_rules import divisions_from_settings, round_size
from tracekit.trace import DeviceInfo, Events, Op, Source, TraceMeta, write_trace

V1_OP = np.array([Op.MALLOC, -1, Op.FREE, Op.SEGMENT_ALLOC, Op.SEGMENT_FREE, Op.SEGMENT_ALLOC,
                  Op.SEGMENT_FREE, Op.OOM], dtype=np.int8)


@dataclass(frozen=True)
class ImportResult:
    """What an import wrote: the path, row counts, and the entries it skipped by action."""

    path: Path
    rows: int
    initial_rows: int
    devices: tuple[int, ...]
    skipped: dict[str, int]


@dataclass(frozen=True, eq=False)
class _DeviceRows:
    rows: Rows
    t_us: np.ndarray  # int64, -1 for initial rows
    initial: np.ndarray
    req_us: np.ndarray  # int64, free_requested time or -1
    device_free: np.ndarray


def default_output(snapshot: Path) -> Path:
    """The snapshot's path with ``.pickle``/``.pkl`` (and ``.gz``) replaced by ``.parquet``."""
    name = snapshot.name
    for suffix in (".gz", ".pickle", ".pkl"):
        name = name.removesuffix(suffix)
    return snapshot.with_name(name + ".parquet")


def import_snapshot(path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None, *,
                    device: int | None = None, stacks: bool = False, progress: bool | None = None,
                    fast: bool | None = None, force: bool = False) -> ImportResult:
    """Read ``path`` and write the v1 trace (``output`` or beside it).

    Snapshots of ``LARGE_BYTES`` or more (or any, with ``fast=True``) go through the
    compiled scanner (``pickle_scan``), which keeps no Python object per history
    entry; anything it does not handle, and every smaller file, is read with the
    restricted unpickler. Both give the same trace. Every row keeps its whole Python stack;
    ``stacks`` keeps C++ frames too. An existing ``output`` is refused (OutputError) unless
    ``force``; the snapshot itself never is.
    """
    src = Path(path)
    check_regular(src, "snapshot")  # before anything opens it: a named pipe would block forever
    out = Path(output) if output is not None else default_output(src)
    check_output(out, (src,), force=force)
    large = src.is_file() and src.stat().st_size >= LARGE_BYTES
    big = progress if progress is not None else large
    snap = None
    if fast if fast is not None else large:
        snap = scan_file(src, progress=big)
    if snap is None:
        snap = load_pickle(src, progress=big)
    c = convert(snap, src, device=device, stacks=stacks, progress=big)
    del snap
    write_trace(out, c.meta, c.events, c.extras)
    return ImportResult(out, len(c.events), c.initial_rows, c.devices, c.skipped)


def scan_file(src: Path, *, progress: bool = False) -> Any | None:
    """The snapshot read by the compiled scanner, or None when it must go to the unpickler."""
    try:
        with open(src, "rb") as f:
            gz = f.read(2) == GZIP_MAGIC
            if gz:
                f.seek(0)
                with gzip.GzipFile(fileobj=f) as g:  # at most 64 bytes per byte of the file (a gzip bomb)
                    limit = UNPICKLE_PER_BYTE * os.fstat(f.fileno()).st_size
                    data = g.read(limit + 1)
                    if len(data) > limit:
                        return None  # the unpickler, under its memory cap, says what is wrong
                    buf = np.frombuffer(data, dtype=np.uint8)
            else:
                buf = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    except (OSError, EOFError, zlib.error, ValueError):
        return None  # the unpickler path reports what is wrong with the file
    bar = Progress("scanning", len(buf), enabled=progress)
    try:
        return scan(buf, bar)
    finally:
        bar.close()


def _shape(snap: Any, where: Path) -> tuple[list[Any], list[Any], dict[str, Any]]:
    if isinstance(snap, list):  # legacy: a bare list of segments, no history
        return snap, [], {}
    if not isinstance(snap, dict):
        raise InputError(f"{where}: not a PyTorch memory snapshot (the pickle holds a {type(snap).__name__})")
    if not any(k in snap for k in ("segments", "device_traces")):
        raise InputError(f"{where}: not a PyTorch memory snapshot (no 'segments' or 'device_traces' key)")
    segs, traces = snap.get("segments") or [], snap.get("device_traces") or []
    if not isinstance(segs, list) or not isinstance(traces, list):
        raise InputError(f"{where}: not a PyTorch memory snapshot ('segments'/'device_traces' are not lists)")
    return segs, traces, snap


@dataclass(frozen=True, eq=False)
class Converted:
    """A snapshot as a trace in memory: metadata, v1 events and the extra columns (Arrow arrays)."""

    meta: TraceMeta
    events: Events
    extras: dict[str, pa.Array]
    devices: tuple[int, ...]
    initial_rows: int
    skipped: dict[str, int]


def convert(snap: Any, where: Path, *, device: int | None = None, stacks: bool = False,
            progress: bool = False) -> Converted:
    """The v1 events, extra columns and metadata of an unpickled snapshot (consumes its history);
    ``stacks`` keeps C++ frames in the rows' stacks."""
    segs, traces, top = _shape(snap, where)
    policy.check_top(segs, traces, top, where)
    present = {i for i, t in enumerate(traces) if t} | {
        int(s.get("device", 0) or 0) for s in segs if isinstance(s, dict)}
    if device is not None and device not in present:
        have = ", ".join(map(str, sorted(present))) or "none"
        raise InputError(f"{where}: the snapshot has no device {device} (devices with data: {have})")
    devices = sorted(present) if device is None else [device]
    raw_settings = top.get("allocator_settings")
    settings: dict[str, Any] = raw_settings if isinstance(raw_settings, dict) else {}
    rnd = partial(round_size, divisions=divisions_from_settings(settings))
    table, skipped = tc.SiteTable(), Counter[str]()
    builder = StackBuilder(keep_native=stacks)
    usable = {d: traces[d] for d in devices if d < len(traces) and isinstance(traces[d], list | EntryList)}
    bar = Progress("converting", sum(len(t) for t in usable.values()), enabled=progress)
    parts, hists = [], []
    for d in devices:
        entries = usable.pop(d, [])
        if d < len(traces):
            traces[d] = None  # nothing but ``entries`` holds the history now
        if isinstance(entries, EntryList):
            h = tc.read_scanned(entries, table, builder, where=str(where))
            bar.advance(len(h))
        else:
            h = tc.read_history(entries, d, table, builder, progress=bar, where=str(where))
        del entries  # the scanned arrays or entry dicts can go before the rows are built
        policy.check_history(h.action, h.addr, h.size, (h.action == tc.ALLOC) | (h.action == tc.OOM), d,
                             where)
        skipped.update(h.skipped)
        try:
            parts.append(_device_rows(h, final_state(segs, d, table, builder), rnd))
        except InputError as e:  # the row budget: name the file and the device
            raise InputError(f"{where}: device {d}: {e}") from None
        hists.append(h)
    bar.close()
    events, extras = _merge(parts, devices, hists, table, builder)
    events = _pair_free_sizes(events)
    ninit = int(np.count_nonzero(extras["initial"]))
    meta = _meta(top, where, settings, skipped, hists, devices, ninit)
    return Converted(meta, events, extras, tuple(devices), ninit, dict(skipped))


def _device_rows(h: tc.History, fs: FinalState, rnd: Any) -> _DeviceRows:
    grid = Grid(h, fs)
    init = initial_rows(h, fs, grid, rnd)
    a = h.action
    mapped = (a == tc.SEGMENT_MAP) | (a == tc.SEGMENT_UNMAP)
    n_cells, cell_addr, cell_size = grid.pieces(h.addr[mapped], h.size[mapped],
                                                limit=policy.row_budget(len(h)))
    count = np.where(a == tc.FREE_REQUESTED, 0, 1).astype(np.int64)
    count[mapped] = n_cells
    src = np.repeat(np.arange(len(h), dtype=np.int64), count)
    op = V1_OP[a[src]]
    addr, size = h.addr[src].copy(), h.size[src].copy()
    from_map = mapped[src]
    addr[from_map], size[from_map] = cell_addr, cell_size
    rounded = np.zeros(len(src), np.uint64)
    is_m = op == Op.MALLOC
    rounded[is_m] = rnd(size[is_m])
    rounded[op == Op.OOM] = size[op == Op.OOM]
    hist = Rows(op, addr, size, rounded, h.stream[src], h.site[src], h.stack[src], from_map)
    req = _free_requested_us(h)[src]
    ni = len(init.op)
    cat = np.concatenate
    rows = Rows(*(cat([getattr(init, f), getattr(hist, f)]) for f in Rows.__dataclass_fields__))
    return _DeviceRows(
        rows=rows, t_us=cat([np.full(ni, -1, np.int64), h.time_us[src]]),
        initial=cat([np.ones(ni, bool), np.zeros(len(src), bool)]),
        req_us=cat([np.full(ni, -1, np.int64), req]),
        device_free=cat([np.full(ni, -1, np.int64), h.device_free[src]]),
    )


def _free_requested_us(h: tc.History) -> np.ndarray:
    """Per entry: for a free_completed, time_us of the free_requested just before it (same addr), else -1."""
    out = np.full(len(h), -1, np.int64)
    a = h.action
    ev = np.flatnonzero((a == tc.ALLOC) | (a == tc.FREE_REQUESTED) | (a == tc.FREE_COMPLETED))
    if not len(ev):
        return out
    ev = ev[np.argsort(h.addr[ev], kind="stable")]  # by address, history order within one
    prev, cur = ev[:-1], ev[1:]
    hit = (a[cur] == tc.FREE_COMPLETED) & (a[prev] == tc.FREE_REQUESTED) & (h.addr[cur] == h.addr[prev])
    out[cur[hit]] = h.time_us[prev[hit]]
    return out


def _merge(parts: list[_DeviceRows], devices: list[int], hists: list[tc.History], table: tc.SiteTable,
           builder: StackBuilder) -> tuple[Events, dict[str, pa.Array]]:
    """All devices in one trace: initial rows first, then history rows by time (stable)."""
    has_time = all(h.has_time for h in hists)
    firsts = [int(h.time_us[0]) for h in hists if len(h)]  # the first entry, rows or not
    t0 = min(firsts) if has_time and firsts else 0
    t_ns, dev, local = [], [], []
    for p, d in zip(parts, devices, strict=True):
        if has_time:
            t = np.where(p.initial, 0, np.maximum(p.t_us - t0, 0) * 1000)
            t = np.maximum.accumulate(t) if len(t) else t
        else:  # no clock in the file: the entry index stands in for time
            t = np.cumsum(~p.initial).astype(np.int64) * (~p.initial)
        t_ns.append(t)
        dev.append(np.full(len(t), d, np.int16))
        local.append(np.arange(len(t)))

    def cat(xs: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(xs) if xs else np.zeros(0, np.int64)

    t_all, dev_all = cat(t_ns), cat(dev).astype(np.int16)
    initial = cat([p.initial for p in parts]).astype(bool)
    order = np.lexsort((cat(local), dev_all, t_all, ~initial))

    def col(name: str) -> np.ndarray:
        return cat([getattr(p.rows, name) for p in parts])[order]

    stack, stacks = builder.table(col("stack"))
    ev = Events.build(
        op=col("op"), size=col("size"), addr=col("addr"), rounded=col("rounded"), t_ns=t_all[order],
        stream=col("stream"), device=dev_all[order], site=col("site"), sites=table.site_tuple(),
        stack=stack, stacks=stacks,
    )
    req = cat([p.req_us for p in parts])[order]
    req_ns = np.where(req >= 0, np.maximum(req - t0, 0) * 1000, 0)
    dfree = cat([p.device_free for p in parts])[order]
    extras: dict[str, pa.Array] = {
        "initial": pa.array(initial[order], pa.bool_()),
        "free_requested_ns": pa.array(req_ns, pa.int64(), mask=req < 0),
        "device_free": pa.array(dfree, pa.int64(), mask=dfree < 0),
        "expandable": pa.array(col("expandable"), pa.bool_()),
    }
    return ev, extras


def _pair_free_sizes(ev: Events) -> Events:
    """``ev`` with each free's size the rounded bytes of the malloc it pairs with (same (device,
    addr), most recent)."""
    from dataclasses import replace

    from tracekit.trace.validate import pair_events

    mate = pair_events(ev.op, ev.addr, ev.device, ev.seq).mate
    free = np.flatnonzero((ev.op == Op.FREE) & (mate >= 0))
    size = ev.size.copy()
    size[free] = ev.rounded[mate[free]]
    return replace(ev, size=size)


def _meta(top: dict[str, Any], where: Path, settings: dict[str, Any], skipped: Counter[str],
          hists: list[tc.History], devices: list[int], ninit: int) -> TraceMeta:
    raw = top.get("tracekit")
    tk: dict[str, Any] = raw if isinstance(raw, dict) else {}
    dev = None
    if tk.get("device_name") or tk.get("total_bytes"):
        free = optional_int(tk.get("free_bytes_at_start"))
        dev = DeviceInfo(tk.get("device_name"), optional_int(tk.get("total_bytes")), free)
    versions = {k: str(tk[v]) for k, v in (("torch", "torch_version"), ("cuda", "cuda_version")) if tk.get(v)}
    info = {
        "snapshot": where.name, "devices": devices, "history_entries": [len(h) for h in hists],
        "initial_rows": ninit, "skipped_actions": dict(skipped),
        "time": "time_us" if all(h.has_time for h in hists) else "entry index (the snapshot has no time_us)",
    }
    extra: dict[str, Any] = {"torch_allocator_settings": settings, "torch_import": info}
    for k in ("memory_fraction", "oom_observer", "workload", "schedule", "max_entries"):
        if k in tk:
            extra[f"torch_{k}"] = tk[k]
    return TraceMeta.new(
        Source.TORCH, device=dev, pool_limit_bytes=optional_int(tk.get("allowed_bytes")),
        command=tk.get("command"), versions=versions, extra=extra,
    )


