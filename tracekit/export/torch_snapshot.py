"""A trace as a PyTorch memory snapshot: the dict ``torch.cuda.memory._snapshot()`` returns, pickled.

So a CuPy recording (or any trace) opens in PyTorch's MemoryViz (https://pytorch.org/memory_viz) and
``python -m torch.cuda._memory_viz``. Plain pickle protocol 4 of builtins only (no PyTorch class, no
global): ``tracekit.export.pickle_writer``. Shape (what ``docs/pytorch.md`` says the importer reads):

- ``device_traces[d]``: device ``d``'s history in seq order, one dict per entry with the keys
  PyTorch 2.11 writes: ``action``, ``addr``, ``size``, ``stream``, ``time_us``,
  ``compile_context`` ("N/A"), ``user_metadata`` ("") and ``frames`` ([{filename, line, name}],
  innermost first, one list shared by the entries of one stack; line 0 where the trace has none;
  at most ``tracekit.export.depth.MAX_FRAMES`` frames, the outer rest left out):
  ``malloc`` → ``alloc`` (``size`` = the request); ``free`` → ``free_requested`` then
  ``free_completed`` (``size`` = its malloc's request, as PyTorch records it); ``segment_alloc`` /
  ``segment_free`` → the same, a ``segment_free`` with its segment's size (``segment_map`` /
  ``segment_unmap`` for the rows a trace marks ``expandable``: PyTorch's expandable segments,
  imported one grid cell per row); ``oom`` →
  ``oom`` (``size`` = the rounded request; ``device_free`` = the free bytes measured at the OOM,
  -1 where the trace has none, in place of ``addr``).
  ``time_us`` = ⌊t_ns / 1000⌋.
- ``segments``: the segments live at the end of the trace, each with its ``blocks`` in address
  order tiling it exactly: each block live at the end (``active_allocated``, ``size`` = rounded,
  ``requested_size`` = the request, its frames) and each gap between them (``inactive``), so
  Σ block sizes = ``total_size`` as PyTorch's own checks (``_memory_viz`` stats) require.
  Adjacent live ``expandable`` cells of one device and stream are one segment again
  (``is_expandable`` true), as PyTorch reports a growing segment, so a block spanning cells lies
  in one segment. A trace without segment rows (raw cudaMalloc) has none.
- ``allocator_settings``: a PyTorch trace's own settings (``torch_allocator_settings``), else absent.
- ``tracekit``: the device name and total, free bytes at start, the pool limit (``allowed_bytes``)
  and the command, which ``tracekit import torch`` reads back and PyTorch ignores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from tracekit.analysis.recording import extra_column
from tracekit.export.depth import MAX_FRAMES, Cut, cut_of, needed, used_stacks
from tracekit.export.moments import event_stacks
from tracekit.export.pickle_writer import (
    Kind,
    Memo,
    Opcode,
    Ref,
    Writer,
    entry_names,
    plain_blob,
    write_entries,
)
from tracekit.trace.reader import Trace
from tracekit.trace.schema import Op
from tracekit.trace.stacks import StackTable

CHUNK = 1 << 18  # trace rows per pass of the compiled writer (its buffer stays ~60 MB)
SMALL_SEGMENT = 2 << 20  # PyTorch's small-pool segments are 2 MiB
TOP = (1 << 64) - 1  # the last address
_KIND = np.array([Kind.ALLOC, Kind.FREE_COMPLETED, Kind.SEGMENT_ALLOC, Kind.SEGMENT_FREE, Kind.OOM],
                 np.int64)  # by Op code; a free's first copy becomes FREE_REQUESTED


def frame_dict(table: StackTable, f: int) -> dict[str, Any]:
    """PyTorch's dict of frame ``f`` (``line`` 0 where unknown)."""
    fr = table.frame_at(f)
    return {"filename": fr.file, "line": max(fr.line, 0), "name": fr.function}


class _Stacks:
    """Memo items of the frame lists: stack ``s`` is the chain [frame dict of ``frame[s]``, *the list of
    ``parent[s]``] (innermost first), written with at most ``memo.limit`` frames, so each frame dict is
    written once; index ``n_stacks`` (the one -1 picks) is the empty list of an event without a stack.
    Only the stacks within the limit of one the events name get an item (``depth.needed``): a chain
    of millions of frames costs the limit, not its length."""

    def __init__(self, memo: Memo, table: StackTable, used: np.ndarray) -> None:
        need = needed(table, used, memo.limit)
        frame: dict[int, int] = {}
        items = np.full(table.n_stacks + 1, -1, np.int64)
        for s, f, p in zip(need.tolist(), table.frame[need].tolist(), table.parent[need].tolist(),
                           strict=True):
            if f not in frame:
                frame[f] = memo.item(("frame", f), plain_blob(frame_dict(table, f)))
            items[s] = memo.chain(("stack", s), frame[f], int(items[p]) if p >= 0 else -1)
        items[-1] = memo.item(("stack", -1), b"]")
        self.items = items

    def of(self, stack: np.ndarray) -> np.ndarray:
        """The memo item of each stack id (-1 picks the last: the empty list)."""
        return self.items[stack]


def write_snapshot(trace: Trace, f: BinaryIO, exporter: str) -> Cut:
    """Pickle ``trace`` as a snapshot into the binary file ``f`` (see the module docstring); each
    frame list holds a stack's innermost ``MAX_FRAMES`` frames at most. Returns what that left out."""
    ev = trace.events
    stack, table = event_stacks(ev)
    memo = Memo(MAX_FRAMES)
    used = used_stacks(stack)
    stacks = _Stacks(memo, table, used)
    names = entry_names(memo)
    w = Writer(f, memo)
    w.op(Opcode.EMPTY_DICT, Opcode.MARK)  # the top-level dict, its items follow
    w.obj("segments")
    w.obj(final_segments(trace, stack, stacks))
    w.obj("device_traces")
    _device_traces(w, trace, stack, stacks, names)
    settings = trace.meta.recorded.torch_settings.raw
    if settings is not None:
        w.obj("allocator_settings")
        w.obj(dict(settings))
    w.obj("tracekit")
    w.obj(tracekit_record(trace, exporter))
    w.op(Opcode.SETITEMS)
    w.end()
    return cut_of(table, used, MAX_FRAMES)


def _device_traces(w: Writer, trace: Trace, stack: np.ndarray, stacks: _Stacks, names: np.ndarray) -> None:
    """The list of every device's history (index = device ordinal, empty lists between)."""
    ev = trace.events
    n_dev = int(ev.device.max()) + 1 if len(ev) else 1
    free_col = extra_column(trace, "device_free")
    expandable = expandable_rows(trace)
    w.op(Opcode.EMPTY_LIST, Opcode.MARK)  # the list of devices, each device's list follows
    for d in range(n_dev):
        w.op(Opcode.EMPTY_LIST)  # its entries are appended in batches
        rows = np.flatnonzero(ev.device == d)
        for lo in range(0, len(rows), CHUNK):
            cols = entry_columns(trace, rows[lo: lo + CHUNK], stack, stacks, free_col, expandable)
            write_entries(w, cols, names)
    w.op(Opcode.APPENDS)


def entry_columns(trace: Trace, rows: np.ndarray, stack: np.ndarray, stacks: _Stacks,
                  free_col: np.ndarray | None, expandable: np.ndarray | None) -> dict[str, np.ndarray]:
    """The history entries of trace ``rows`` as columns (a free is two entries)."""
    ev, mate = trace.events, trace.mate
    op = ev.op[rows]
    idx = np.repeat(rows, np.where(op == Op.FREE, 2, 1))
    first = np.r_[True, idx[1:] != idx[:-1]] if len(idx) else np.zeros(0, bool)
    o = ev.op[idx]
    kind = _KIND[o]
    kind[(o == Op.FREE) & first] = Kind.FREE_REQUESTED
    if expandable is not None:
        kind[(o == Op.SEGMENT_ALLOC) & expandable[idx]] = Kind.SEGMENT_MAP
        kind[(o == Op.SEGMENT_FREE) & expandable[idx]] = Kind.SEGMENT_UNMAP
    m = mate[idx]
    size = ev.size[idx].copy()
    paired = ((o == Op.FREE) | (o == Op.SEGMENT_FREE)) & (m >= 0)
    size[paired] = ev.size[m[paired]]  # as PyTorch: a free with its block's request, a segment's its size
    oom = o == Op.OOM
    size[oom] = ev.rounded[idx[oom]]
    addr = np.where(oom, np.uint64(0), ev.addr[idx])
    device_free = np.full(len(idx), -1, np.int64)
    if free_col is not None:
        device_free[oom] = free_col[idx[oom]]
    return {"kind": kind, "addr": addr, "size": size, "stream": ev.stream[idx],
            "time_us": ev.t_ns[idx] // 1000, "frames": stacks.of(stack[idx]), "device_free": device_free}


def expandable_rows(trace: Trace) -> np.ndarray | None:
    """The trace's ``expandable`` column (bool per event, null as false), or None without one."""
    tbl = trace.extras
    if tbl is None or "expandable" not in tbl.column_names:
        return None
    col = tbl.column("expandable")
    if not pa.types.is_boolean(col.type):
        return None
    return np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)


def live_segments(trace: Trace) -> list[tuple[int, int, int, int, int, bool]]:
    """(device, address, size, stream, row of the first segment_alloc, expandable) of each segment
    live at the end, by device and address; adjacent expandable cells of one device and stream
    joined into one (``Σ`` of their sizes)."""
    ev, mate = trace.events, trace.mate
    segs = np.flatnonzero((ev.op == Op.SEGMENT_ALLOC) & (mate < 0))
    segs = segs[np.lexsort((ev.addr[segs], ev.device[segs]))]
    flags = expandable_rows(trace)
    grow = flags[segs] if flags is not None else np.zeros(len(segs), bool)
    out: list[tuple[int, int, int, int, int, bool]] = []
    for s, x in zip(segs.tolist(), grow.tolist(), strict=True):
        d, a, n, st = int(ev.device[s]), int(ev.addr[s]), int(ev.size[s]), int(ev.stream[s])
        if out and x and out[-1][5] and out[-1][0] == d and out[-1][3] == st and out[-1][1] + out[-1][2] == a:
            last = out[-1]
            out[-1] = (d, last[1], last[2] + n, st, last[4], True)
        else:
            out.append((d, a, n, st, s, x))
    return out


def final_segments(trace: Trace, stack: np.ndarray, stacks: _Stacks) -> list[dict[str, Any]]:
    """The segments live at the end, each tiled by its live blocks and the gaps between them.

    One dict per live segment and per block in it (the allocator's state at the end, not one per
    event). A block that lies in no live segment of its device stays in the history only."""
    ev, mate = trace.events, trace.mate
    blocks = np.flatnonzero((ev.op == Op.MALLOC) & (mate < 0))
    blocks = blocks[np.lexsort((ev.addr[blocks], ev.device[blocks]))]
    b_dev, b_addr = ev.device[blocks].astype(np.int64), ev.addr[blocks]
    empty = Ref(int(stacks.items[-1]))
    out = []
    for d, base, total, stream, s, grows in live_segments(trace):
        lo = np.searchsorted(b_dev, d, "left")
        hi = np.searchsorted(b_dev, d, "right")
        a = lo + int(np.searchsorted(b_addr[lo:hi], np.uint64(base), "left"))
        end = base + total  # 2^64 at most (the reader refuses ranges past it)
        z = hi if end > TOP else lo + int(np.searchsorted(b_addr[lo:hi], np.uint64(end), "left"))
        tiles, cursor, active, requested = [], base, 0, 0
        for b in blocks[a:z].tolist():
            start, size = int(ev.addr[b]), int(ev.rounded[b])
            if start < cursor:  # overlaps the block before it: the trace contradicts itself here
                continue
            size = min(size, base + total - start)
            if start > cursor:
                tiles.append(_block(cursor, start - cursor, 0, "inactive", empty))
            req = min(int(ev.size[b]), size)
            frames = Ref(int(stacks.of(stack[b: b + 1])[0]))
            tiles.append(_block(start, size, req, "active_allocated", frames))
            cursor, active, requested = start + size, active + size, requested + req
        if cursor < base + total:
            tiles.append(_block(cursor, base + total - cursor, 0, "inactive", empty))
        out.append({
            "device": d, "address": base, "total_size": total, "allocated_size": active,
            "active_size": active, "requested_size": requested, "stream": stream,
            "segment_type": "small" if total <= SMALL_SEGMENT else "large", "segment_pool_id": (0, 0),
            "is_expandable": grows, "frames": Ref(int(stacks.of(stack[s: s + 1])[0])), "blocks": tiles,
        })
    return out


def _block(addr: int, size: int, requested: int, state: str, frames: Ref) -> dict[str, Any]:
    return {"address": addr, "size": size, "requested_size": requested, "state": state, "frames": frames}


def tracekit_record(trace: Trace, exporter: str) -> dict[str, Any]:
    """The top-level ``tracekit`` key: what ``tracekit import torch`` reads back into the metadata."""
    meta = trace.meta
    rec: dict[str, Any] = {"exporter": exporter, "source": meta.source.value}
    if trace.path is not None:
        rec["trace"] = Path(trace.path).name
    dev = meta.device
    pairs = {
        "device_name": dev.name if dev else None, "total_bytes": dev.total_bytes if dev else None,
        "free_bytes_at_start": dev.free_bytes if dev else None, "allowed_bytes": meta.pool_limit_bytes,
        "command": meta.command, "torch_version": meta.versions.get("torch"),
        "cuda_version": meta.versions.get("cuda"),
    }
    rec.update({k: v for k, v in pairs.items() if v is not None})
    return rec
