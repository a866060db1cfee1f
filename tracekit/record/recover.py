"""Turning a spool into a trace: at the end of a recording, or after a crash.

``finalize`` reads the spool twice, batch by batch (memory stays near one
batch plus the output row group): the first pass collects call-site names
and notes, the second writes the events through ``TraceWriter`` (atomic
rename), with ``seq`` numbered in spool order. ``recover`` does the same for
a spool left behind by a killed recording and marks the trace
``"complete": false``; a last batch cut short by the kill is skipped, so
what is lost is at most the flush interval before the kill.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit.errors import InputError
from tracekit.outputs import check_output
from tracekit.record.finish import (
    EXTRA_FIELDS,
    SegmentIndex,
    batch_columns,
    segment_index,
    segment_rows,
    v2_meta,
)
from tracekit.record.spool import NOTE_ROW, SITE_ROW, SPOOL_KEY
from tracekit.trace.events import Events
from tracekit.trace.schema import META_KEY, TraceMeta
from tracekit.trace.writer import TraceWriter

ROW_GROUP = 1 << 20


@dataclass
class SpoolScan:
    """What the first pass over a spool found."""

    meta: TraceMeta
    sites: list[str] = field(default_factory=list)
    notes: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    batches: int = 0
    truncated: bool = False
    segments: list[np.ndarray] = field(default_factory=list)  # segment rows, see finish.segment_rows


@contextmanager
def _open(path: Path) -> Iterator[pa.ipc.RecordBatchStreamReader]:
    """The spool's stream reader; the memory map is closed when the block ends."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    bad = f"{path}: not a tracekit recording spool, or the recording was killed before it began"
    try:
        source = pa.memory_map(str(path))
    except OSError as e:
        raise InputError(f"{path}: cannot read the spool ({e.strerror or e})") from None
    with source:
        try:
            reader = pa.ipc.open_stream(source)
        except (pa.ArrowInvalid, OSError):
            raise InputError(bad) from None
        md = reader.schema.metadata or {}
        if SPOOL_KEY not in md or META_KEY not in md:
            raise InputError(f"{path}: an Arrow stream, but not a tracekit recording spool")
        yield reader


def _batches(reader: pa.ipc.RecordBatchStreamReader,
             scan: SpoolScan | None = None) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError):  # the last batch was cut short by a kill
            if scan is not None:
                scan.truncated = True
            return
        yield batch


def scan_spool(path: Path) -> SpoolScan:
    """Pass 1: metadata, call-site names, notes (with the seq of the event each describes), counts."""
    with _open(path) as reader:
        meta = TraceMeta.from_json(reader.schema.metadata[META_KEY], str(path))
        scan = SpoolScan(meta)
        for batch in _batches(reader, scan):
            _scan_batch(scan, batch)
    return scan


def _scan_batch(scan: SpoolScan, batch: pa.RecordBatch) -> None:
    op = batch.column("op").to_numpy()
    text = batch.column("text")
    for i in np.flatnonzero(op == SITE_ROW):
        site = int(batch.column("site")[i].as_py())
        while len(scan.sites) <= site:
            scan.sites.append("")
        scan.sites[site] = text[i].as_py()
    events_before = np.cumsum(op >= 0)
    t_ns = batch.column("t_ns").to_numpy()
    for i in np.flatnonzero(op == NOTE_ROW):
        note = json.loads(text[i].as_py())
        scan.notes.append({"seq": scan.events + int(events_before[i]) - 1, "t_ns": int(t_ns[max(i - 1, 0)]),
                           **note})
    scan.segments.append(segment_rows(batch, scan.events))
    scan.events += int(events_before[-1]) if len(op) else 0
    scan.batches += 1


def _events(batch: pa.RecordBatch, seq0: int, sites: tuple[str, ...],
            index: SegmentIndex) -> tuple[Events, dict[str, pa.Array], int]:
    keep = batch.column("op").to_numpy() >= 0
    col = {n: batch.column(n).to_numpy()[keep] for n in
           ("t_ns", "op", "addr", "size", "rounded", "stream", "site")}
    n = int(keep.sum())
    seq = np.arange(seq0, seq0 + n, dtype=np.uint64)
    device, extras, mismatches = batch_columns(batch, keep, seq, index)
    ev = Events.build(
        col["op"], col["size"], addr=col["addr"], rounded=col["rounded"], t_ns=col["t_ns"],
        seq=seq, stream=col["stream"], device=device, site=col["site"], sites=sites,
    )
    return ev, extras, mismatches


def finalize(spool: Path, output: Path, extra: dict[str, Any]) -> Path:
    """Write the trace ``output`` from ``spool``; ``extra`` goes into the metadata."""
    scan = scan_spool(spool)
    ooms = [{k: v for k, v in n.items() if k != "state"} for n in scan.notes if n.get("kind") == "oom"]
    index = segment_index(scan.segments)
    with _open(spool) as reader:  # the device mismatches go into the metadata, written first
        mismatches, seq = 0, 0
        for batch in _batches(reader):
            ev, _, m = _events(batch, seq, (), index)
            seq, mismatches = seq + len(ev), mismatches + m
    meta = scan.meta.with_extra(ooms=ooms, **extra).with_extra(**v2_meta(scan.notes, extra, mismatches))
    if scan.truncated:
        meta = meta.with_extra(spool_truncated=True)
    sites = tuple(scan.sites)
    seq = 0
    pending: list[tuple[Events, dict[str, pa.Array]]] = []
    with _open(spool) as reader, TraceWriter(output, meta, EXTRA_FIELDS) as w:
        for batch in _batches(reader):
            ev, extras, _ = _events(batch, seq, sites, index)
            seq += len(ev)
            pending.append((ev, extras))
            if sum(len(e) for e, _ in pending) >= ROW_GROUP:
                _write(w, pending)
                pending = []
        if pending:
            _write(w, pending)
    return output


def _write(w: TraceWriter, parts: list[tuple[Events, dict[str, pa.Array]]]) -> None:
    w.write(Events.concat([e for e, _ in parts]),
            {f.name: pa.concat_arrays([x[f.name] for _, x in parts]) for f in EXTRA_FIELDS})


def default_output(spool: Path) -> Path:
    return spool.with_name(spool.name.removesuffix(".spool")) if spool.name.endswith(".spool") \
        else spool.with_name(spool.name + ".parquet")


def recover(path: Path, output: Path | None = None, *, force: bool = False) -> Path:
    """Make a trace from the spool of an unfinished recording (``path`` or ``path``.spool)."""
    spool = path if path.name.endswith(".spool") else path.with_name(path.name + ".spool")
    if not spool.exists():
        raise InputError(f"{path}: no spool beside it ({spool}); nothing to recover")
    out = output or default_output(spool)
    check_output(out, (path, spool), force=force)
    return finalize(spool, out, {"complete": False, "recovered_from": str(spool)})
