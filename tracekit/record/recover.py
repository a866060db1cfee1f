"""Turning a spool into a trace: at the end of a recording, or after a crash.

``finalize`` reads the spool three times, batch by batch: the first pass
collects call-site names, frames and stacks, notes and segment rows (from which the segment
index is built); the second resolves every block row against that index only
to count the rows whose device disagrees with their segment's, because that
count goes into the metadata and the metadata is written before the first
row group; the third resolves them again and writes the events through
``TraceWriter`` (atomic rename), with ``seq`` numbered in spool order. Memory
stays near one batch plus one output row group (``ROW_GROUP`` events) plus
the call-site names, the notes and the segment index (one entry per
``cudaMalloc`` of a pool); time is three decodes of the spool plus two
segment lookups per block row. ``recover`` does the same for
a spool left behind by a killed recording and marks the trace
``"complete": false``; a last batch cut short by the kill is skipped, so
what is lost is at most the flush interval before the kill.

A spool is untrusted input like any other (see "Input policy" in
docs/trace-format.md): ``_open`` checks its columns and types once, and
``_checked`` every batch before any arithmetic (op codes, nulls, sizes below
2^62 and requests below 2^60, device ordinals, call-site, frame and stack ids
defined densely and in order, a stack's frame defined and its parent earlier,
frames as bounded JSON, notes as bounded JSON objects; an event's stack id that
names no stack reads as none); ``t_ns`` that steps back (threads
that stamped out of order) is clamped to the time before it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tracekit import progress
from tracekit.errors import InputError
from tracekit.inputs import check_regular, load_json, safe_text, stat_or_none
from tracekit.outputs import check_output
from tracekit.record.finish import (
    EXTRA_FIELDS,
    SegmentIndex,
    batch_columns,
    segment_index,
    segment_rows,
    v2_meta,
)
from tracekit.record.spool_format import (
    FRAME_ROW,
    MAGIC,
    NOTE_ROW,
    SITE_ROW,
    SPOOL_KEY,
    SPOOL_SCHEMA,
    STACK_FIELD,
    STACK_ROW,
    SpoolFrames,
)
from tracekit.record.tail import tail_path
from tracekit.trace.events import Events
from tracekit.trace.schema import META_KEY, Op, TraceMeta
from tracekit.trace.stacks import CUT_MARK, MAX_FRAME_TEXT_BYTES, MAX_LINE, FrameKind, StackTable
from tracekit.trace.writer import TraceWriter

ROW_GROUP = 1 << 20
HEAD_RESTORED = ("the spool's first bytes (its metadata) were written over; the recorder's own copy of them "
                 "was used")
NO_TIME = np.iinfo(np.int64).min  # before the first event row


@dataclass
class SpoolScan:
    """What the first pass over a spool found."""

    meta: TraceMeta
    sites: list[str] = field(default_factory=list)
    frames: list[tuple[str, int, str, int]] = field(default_factory=list)  # file, line, function, kind
    stacks: list[tuple[int, int]] = field(default_factory=list)  # frame, parent
    notes: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    batches: int = 0
    truncated: bool = False
    segments: list[np.ndarray] = field(default_factory=list)  # segment rows, see finish.segment_rows
    t_last: int = NO_TIME  # the last event row's time so far, as the trace will carry it
    tail_rows: int = 0  # rows taken from the spool's tail (``record.tail``): the process ended unfinished
    tail_lost: int = 0  # rows between the spool's last and the tail's first that neither held
    damaged: str | None = None  # where and why the spool stopped making sense (its prefix is kept)
    cut: str | None = None  # where the spool was cut short (``truncated``), where known
    head_restored: bool = False  # its metadata frame written over: the recorder's own copy read
    tail_damaged: str | None = None  # where and why the tail's rows stopped making sense


class _Spool:
    """An open spool of either layout: its metadata and its batches in the Arrow spool layout
    (``frames``: the reader of a version-4 spool, which knows its tail and where it stopped)."""

    def __init__(self, path: Path, meta_json: bytes, batches: Iterator[pa.RecordBatch],
                 frames: SpoolFrames | None = None) -> None:
        self.path, self.meta_json, self._batches, self._frames = path, meta_json, batches, frames

    def tail(self, scan: SpoolScan) -> None:
        """Into ``scan``: the rows taken from the spool's tail, those neither held, its damage."""
        if self._frames is not None:
            scan.tail_rows, scan.tail_lost = self._frames.tail_rows, self._frames.tail_lost
            scan.tail_damaged = self._frames.tail_damaged
            scan.head_restored = self._frames.head_restored

    def batches(self, scan: SpoolScan | None = None) -> Iterator[pa.RecordBatch]:
        """Every whole batch, checked; ``scan.truncated`` is set where the spool was cut short."""
        while True:
            try:
                batch = next(self._batches)
            except StopIteration:
                break
            except (pa.ArrowInvalid, OSError):  # the last Arrow batch was cut short by a kill
                if scan is not None:
                    scan.truncated = True
                return
            try:
                checked = _checked(self.path, batch)
            except InputError as e:  # values the recorder never writes: keep the batches before
                if scan is not None:
                    scan.damaged = f"after {scan.events:,} events: {str(e).removeprefix(f'{self.path}: ')}"
                return
            yield checked
        frames = self._frames
        if scan is not None and frames is not None:
            scan.truncated, scan.cut = scan.truncated or frames.truncated, frames.cut
            scan.damaged = frames.damaged or scan.damaged


@contextmanager
def _open(path: Path, tail: Path | None = None, head: bytes | None = None) -> Iterator[_Spool]:
    """The spool (a version-4 framed spool, or the Arrow stream of earlier recorders), closed when
    the block ends; ``tail`` is its ring where not beside it (``tail_path``), ``head`` its magic and
    metadata frame as the recorder wrote them (``SpoolFrames``)."""
    check_regular(path, "spool")
    try:
        f = open(path, "rb")  # noqa: SIM115 (closed below, after the block)
    except OSError as e:
        raise InputError(f"{path}: cannot read the spool ({e.strerror or e})") from None
    with f:
        magic = f.read(len(MAGIC))
        f.seek(0)
        if magic == MAGIC or head is not None:
            frames = SpoolFrames(path, f, tail or tail_path(path), check=_checked, head=head)
            yield _Spool(path, frames.meta_json, frames.batches(), frames)
            return
        with _arrow(path) as reader:
            yield _Spool(path, reader.schema.metadata[META_KEY], _arrow_batches(reader))


def _arrow_batches(reader: pa.ipc.RecordBatchStreamReader) -> Iterator[pa.RecordBatch]:
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            return


@contextmanager
def _arrow(path: Path) -> Iterator[pa.ipc.RecordBatchStreamReader]:
    """The stream reader of an Arrow spool (recorders before version 4); the memory map is closed
    when the block ends."""
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
        for f in SPOOL_SCHEMA:
            have = reader.schema.field(f.name).type if f.name in reader.schema.names else None
            if have != f.type and (have is not None or f.name not in OPTIONAL):
                raise InputError(f"{path}: not a tracekit recording spool (column '{f.name}' is {have}, "
                                 f"expected {f.type})")
        names = reader.schema.names
        stack = reader.schema.field(STACK_FIELD.name).type if STACK_FIELD.name in names else None
        if stack is not None and stack != STACK_FIELD.type:
            raise InputError(f"{path}: not a tracekit recording spool (column 'stack' is {stack}, expected "
                             f"{STACK_FIELD.type})")
        if len(set(reader.schema.names)) != len(reader.schema.names):
            raise InputError(f"{path}: not a tracekit recording spool (a column appears twice)")
        yield reader


OPTIONAL = ("pool", "device_free")  # spools of version 1 recordings have neither
MAX_SIZE, MAX_REQUEST, MAX_DEVICE = 1 << 62, 1 << 60, 32767


def _checked(path: Path, batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` if every value is in range (see the module docstring), else InputError."""
    op = batch.column("op")
    if op.null_count:
        raise InputError(f"{path}: a spool row has no op")
    code = op.to_numpy()
    if len(code) and (code.min() < STACK_ROW or code.max() > Op.OOM):
        bad = int(code[(code < STACK_ROW) | (code > Op.OOM)][0])
        raise InputError(f"{path}: a spool row has op code {bad}, not one of the recorder's")
    ev = code >= 0
    for name in ("t_ns", "size", "device", "stream", "addr"):
        col = batch.column(name)
        need = ev & (code != Op.OOM) if name == "addr" else ev
        if col.null_count and np.any(col.is_null().to_numpy(zero_copy_only=False) & need):
            raise InputError(f"{path}: a spool event has no {name}")
    size = batch.column("size").fill_null(0).to_numpy()
    req = ev & ((code == Op.MALLOC) | (code == Op.OOM))
    if np.any(ev & (size >= MAX_SIZE)) or np.any(req & (size >= MAX_REQUEST)):
        raise InputError(f"{path}: a spool event has a size beyond any device (2^60 bytes or more)")
    dev = batch.column("device").fill_null(0).to_numpy()
    if np.any(ev & ((dev < 0) | (dev > MAX_DEVICE))):
        raise InputError(f"{path}: a spool event names a device outside 0..{MAX_DEVICE}")
    named = (code == SITE_ROW) | (code == FRAME_ROW) | (code == STACK_ROW)
    if np.any(named & batch.column("site").is_null().to_numpy(zero_copy_only=False)):
        raise InputError(f"{path}: a call-site, frame or stack row of the spool has no id")
    return batch


def scan_spool(path: Path, tail: Path | None = None, head: bytes | None = None) -> SpoolScan:
    """Pass 1: metadata, call-site names, notes (with the seq of the event each describes), counts."""
    with _open(path, tail, head) as spool:
        scan = SpoolScan(_meta(path, spool.meta_json))
        for batch in spool.batches(scan):
            before = len(scan.sites), len(scan.frames), len(scan.stacks), len(scan.notes), len(scan.segments)
            try:
                _scan_batch(path, scan, batch)
            except InputError as e:  # ids or notes the recorder never writes: keep the batches before
                del scan.sites[before[0]:], scan.frames[before[1]:], scan.stacks[before[2]:]
                del scan.notes[before[3]:], scan.segments[before[4]:]
                scan.damaged = f"after {scan.events:,} events: {str(e).removeprefix(f'{path}: ')}"
                break
        spool.tail(scan)
    return scan


def _meta(path: Path, raw: bytes) -> TraceMeta:
    d = load_json(raw, str(path), "the spool's metadata")
    if not isinstance(d, dict):
        raise InputError(f"{path}: the spool's metadata is not a JSON object")
    return TraceMeta.from_dict(d, str(path))


def _scan_batch(path: Path, scan: SpoolScan, batch: pa.RecordBatch) -> None:
    op = batch.column("op").to_numpy()
    text = batch.column("text")
    for i in np.flatnonzero(op == SITE_ROW):
        site = int(batch.column("site")[i].as_py())
        if not 0 <= site <= len(scan.sites):  # the recorder numbers call-sites 0, 1, 2, ... as they appear
            raise InputError(f"{path}: call-site id {site} out of order (next expected {len(scan.sites)})")
        if site == len(scan.sites):
            scan.sites.append("")
        scan.sites[site] = text[i].as_py() or ""
    _scan_stacks(path, scan, batch, op)
    events_before = np.cumsum(op >= 0)
    # A note describes the event row before it: it takes that row's time as the trace will hold it
    # (never stepping back, see _events), not the time of a site or note row in between.
    t_ev = np.where(op >= 0, batch.column("t_ns").fill_null(0).to_numpy(), NO_TIME)
    t_ns = np.maximum.accumulate(np.maximum(t_ev, scan.t_last)) if len(op) else t_ev
    for i in np.flatnonzero(op == NOTE_ROW):
        note = load_json(text[i].as_py() or "", str(path), "a note in the spool")
        if not isinstance(note, dict):
            raise InputError(f"{path}: a note in the spool is not a JSON object")
        t = int(t_ns[i])
        scan.notes.append({"seq": scan.events + int(events_before[i]) - 1, "t_ns": 0 if t == NO_TIME else t,
                           **note})
    if len(op):
        scan.t_last = int(t_ns[-1])
    scan.segments.append(segment_rows(batch, scan.events))
    scan.events += int(events_before[-1]) if len(op) else 0
    scan.batches += 1


def _scan_stacks(path: Path, scan: SpoolScan, batch: pa.RecordBatch, op: np.ndarray) -> None:
    """The frame and stack rows of a batch into ``scan``, each checked (the module docstring)."""
    rows = np.flatnonzero((op == FRAME_ROW) | (op == STACK_ROW))
    if not len(rows):
        return
    ids = batch.column("site").to_numpy(zero_copy_only=False)
    addr, size = (batch.column(n).fill_null(0).to_numpy(zero_copy_only=False) for n in ("addr", "size"))
    text = batch.column("text")
    for i in rows:
        at, a, b = int(ids[i]), int(addr[i]), int(size[i])
        if op[i] == FRAME_ROW:
            if at != len(scan.frames):
                raise InputError(f"{path}: frame id {at} out of order (next expected {len(scan.frames)})")
            scan.frames.append(_frame(path, text[i].as_py(), a - 1, b))
        else:
            if at != len(scan.stacks):
                raise InputError(f"{path}: stack id {at} out of order (next expected {len(scan.stacks)})")
            if not (0 <= a < len(scan.frames) and -1 <= b - 1 < at):
                raise InputError(f"{path}: stack {at} names frame {a} and parent {b - 1}; a stack's frame "
                                 "must be defined before it and its parent be an earlier stack")
            scan.stacks.append((a, b - 1))


def _frame(path: Path, text: str | None, line: int, kind: int) -> tuple[str, int, str, int]:
    """A frame row's (file, line, function, kind), or InputError saying what is wrong with it."""
    names = load_json(text or "", str(path), "a frame in the spool")
    if not (isinstance(names, list) and len(names) == 2 and all(isinstance(x, str) for x in names)):
        raise InputError(f"{path}: a frame in the spool is not a [file, function] pair of strings")
    if max(len(x.encode("utf-8", "surrogatepass")) for x in names) > MAX_FRAME_TEXT_BYTES:
        raise InputError(f"{path}: a frame in the spool names a file or function of more than "
                         f"{MAX_FRAME_TEXT_BYTES:,} bytes")
    if not (-1 <= line <= MAX_LINE and 0 <= kind <= max(FrameKind)):
        raise InputError(f"{path}: a frame in the spool has line {line} or kind {kind}, out of range")
    return names[0], line, names[1], kind


def stack_table(scan: SpoolScan) -> StackTable | None:
    """The spool's stack table; None where it recorded no stacks (the call-sites then stand as
    one-frame stacks, as in traces of format 2)."""
    if not scan.frames and not scan.stacks:
        return None
    file, line, function, kind = zip(*scan.frames, strict=True) if scan.frames else ((), (), (), ())
    frame, parent = zip(*scan.stacks, strict=True) if scan.stacks else ((), ())
    return StackTable.build(file, line, function, kind, frame, parent)  # consistent: checked per row


def _events(batch: pa.RecordBatch, seq0: int, sites: tuple[str, ...],
            index: SegmentIndex, t_floor: int = NO_TIME,
            fill: tuple[int, int] | None = None,
            stacks: StackTable | None = None) -> tuple[Events, dict[str, pa.Array], int]:
    """The batch's events numbered from ``seq0``; ``fill`` = (seq, site id) names the site of that
    event where the spool has none (the fatal OOM's site, from the program's exception)."""
    keep = batch.column("op").to_numpy() >= 0
    col = {n: batch.column(n).fill_null(0).to_numpy()[keep] for n in
           ("t_ns", "op", "addr", "size", "rounded", "stream")}
    site = batch.column("site").fill_null(-1).to_numpy()[keep]
    col["site"] = np.where((site >= 0) & (site < len(sites)), site, -1).astype(np.int32)
    if fill is not None and seq0 <= fill[0] < seq0 + len(site) and col["site"][fill[0] - seq0] < 0:
        col["site"][fill[0] - seq0] = fill[1]
    if len(col["t_ns"]):  # time never steps back, so the trace reads
        col["t_ns"] = np.maximum.accumulate(np.maximum(col["t_ns"], t_floor))
    n = int(keep.sum())
    seq = np.arange(seq0, seq0 + n, dtype=np.uint64)
    device, extras, mismatches = batch_columns(batch, keep, seq, index)
    stack = None
    if stacks is not None:
        raw = batch.column("stack").fill_null(-1).to_numpy()[keep] if "stack" in batch.schema.names \
            else np.full(n, -1)
        stack = np.where((raw >= 0) & (raw < stacks.n_stacks), raw, -1).astype(np.int32)
    ev = Events.build(
        col["op"], col["size"], addr=col["addr"], rounded=col["rounded"], t_ns=col["t_ns"],
        seq=seq, stream=col["stream"], device=device, site=col["site"], sites=sites,
        stack=stack, stacks=stacks,
    )
    return ev, extras, mismatches


def finalize(spool: Path, output: Path, extra: dict[str, Any], *, tail: Path | None = None,
             head: bytes | None = None) -> Path:
    """Write the trace ``output`` from ``spool`` (``tail``: its ring where not beside it; ``head``: its
    magic and metadata frame as the recorder wrote them, used where the file's were written over);
    ``extra`` goes into the metadata."""
    scan = scan_spool(spool, tail, head)
    if scan.damaged is not None and scan.events == 0 and not scan.tail_rows:
        raise InputError(f"{spool}: no event in it is intact: the spool stops making sense {scan.damaged}")
    ooms = [{k: v for k, v in n.items() if k != "state"} for n in scan.notes if n.get("kind") == "oom"]
    index = segment_index(scan.segments)
    with _open(spool, tail, head) as sp:  # the device mismatches go into the metadata, written first
        mismatches, seq = 0, 0
        # Progress in batches over the three passes; the first (the scan) is done here.
        for i, batch in enumerate(sp.batches()):
            if i >= scan.batches:  # a damaged spool: only the batches the scan kept
                break
            ev, _, m = _events(batch, seq, (), index)
            seq, mismatches = seq + len(ev), mismatches + m
            progress.report(scan.batches + i + 1, 3 * scan.batches)
    try:
        v2 = v2_meta(scan.notes, extra, mismatches)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError):
        raise InputError(f"{spool}: a note in the spool has a malformed field") from None
    meta = scan.meta.with_extra(ooms=ooms, **extra).with_extra(**v2)
    if scan.truncated:
        meta = meta.with_extra(spool_truncated=True)
        if scan.cut is not None:
            meta = meta.with_extra(spool_cut=scan.cut)
    if scan.damaged is not None:  # the events before the damage are the trace's; the rest is lost
        meta = meta.with_extra(spool_damaged=scan.damaged)
    if scan.tail_rows or scan.tail_lost:  # rows a dead process left only in its shared ring
        meta = meta.with_extra(tail_rows=scan.tail_rows, tail_rows_lost=scan.tail_lost)
    if scan.tail_damaged is not None:
        meta = meta.with_extra(tail_damaged=scan.tail_damaged)
    if scan.head_restored:
        meta = meta.with_extra(spool_head_restored=HEAD_RESTORED)
    cut = (sum(CUT_MARK in x for x in scan.sites)
           + sum(CUT_MARK in f[0] or CUT_MARK in f[2] for f in scan.frames))
    if cut:  # names the recorder shortened to the reader's bound (trace.stacks.cut_text)
        meta = meta.with_extra(names_cut=cut)
    sites, fill = _exception_site(tuple(scan.sites), v2.get("exit"))
    stacks = stack_table(scan)  # one table object for every batch: the writer remaps nothing
    seq, t_floor = 0, NO_TIME
    pending: list[tuple[Events, dict[str, pa.Array]]] = []
    held = 0
    with _open(spool, tail, head) as sp, TraceWriter(output, meta, EXTRA_FIELDS) as w:
        for i, batch in enumerate(sp.batches()):
            if i >= scan.batches:
                break
            ev, extras, _ = _events(batch, seq, sites, index, t_floor, fill, stacks)
            seq += len(ev)
            t_floor = int(ev.t_ns[-1]) if len(ev) else t_floor
            pending.append((ev, extras))
            held += len(ev)  # a running count: a spool of many small frames stays linear
            if held >= ROW_GROUP:
                _write(w, pending)
                pending, held = [], 0
            progress.report(2 * scan.batches + i + 1, 3 * scan.batches)
        if pending:
            _write(w, pending)
    return output


def spool_notes(extra: Mapping[str, Any]) -> list[str]:
    """What the terminal is told of a trace written from a spool that did not end whole: where it
    stopped and why, what the tail gave back, what is lost (one sentence each; empty when whole)."""
    out = []
    damaged, cut = extra.get("spool_damaged"), extra.get("spool_cut")
    tail, lost, tail_bad = extra.get("tail_rows"), extra.get("tail_rows_lost"), extra.get("tail_damaged")
    from_tail = (f"; {tail:,} rows after that point came back from its tail" if isinstance(tail, int) and tail
                 else "")
    if isinstance(damaged, str):
        out.append(f"tracekit: the spool stops making sense {safe_text(damaged)} (written over by "
                   f"something other than the recorder); the trace holds the events before that point"
                   f"{from_tail}")
    elif isinstance(cut, str):
        out.append(f"tracekit: the spool is cut short {safe_text(cut)}; the trace holds the whole frames "
                   f"before that point{from_tail}")
    if isinstance(extra.get("spool_head_restored"), str):
        out.append(f"tracekit: {extra['spool_head_restored']}")
    if isinstance(extra.get("spool_gone"), str):
        out.append(f"tracekit: {extra['spool_gone']}")
    if isinstance(lost, int) and lost:
        out.append(f"tracekit: {lost:,} rows between the spool's last and its tail's first are lost "
                   "(neither held them)")
    if isinstance(tail_bad, str):
        out.append(f"tracekit: the spool's tail stops making sense {safe_text(tail_bad)}; its rows "
                   "before that are in the trace")
    return out


def _exception_site(sites: tuple[str, ...], exit_info: Any) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """(the site dictionary, (seq, site id)) where the fatal OOM may take its site from the
    program's exception (``exit.site``): used only if its own row has none."""
    if not isinstance(exit_info, dict):
        return sites, None
    seq, text = exit_info.get("oom_seq"), exit_info.get("site")
    if not isinstance(seq, int) or not isinstance(text, str):
        return sites, None
    if text in sites:
        return sites, (seq, sites.index(text))
    return (*sites, text), (seq, len(sites))


def _write(w: TraceWriter, parts: list[tuple[Events, dict[str, pa.Array]]]) -> None:
    w.write(Events.concat([e for e, _ in parts]),
            {f.name: pa.concat_arrays([x[f.name] for _, x in parts]) for f in EXTRA_FIELDS})


def default_output(spool: Path) -> Path:
    return spool.with_name(spool.name.removesuffix(".spool")) if spool.name.endswith(".spool") \
        else spool.with_name(spool.name + ".parquet")


def recover(path: Path, output: Path | None = None, *, force: bool = False) -> Path:
    """Make a trace from the spool of an unfinished recording (``path`` or ``path``.spool)."""
    if not path.name:  # "." or "/": no file name to find a spool beside
        raise InputError(f"{safe_text(path)}: is a folder, not a spool or a trace file")
    spool = path if path.name.endswith(".spool") else path.with_name(path.name + ".spool")
    if stat_or_none(spool, "spool") is None:
        raise InputError(f"{safe_text(path)}: no spool beside it ({safe_text(spool)}); nothing to recover")
    out = output or default_output(spool)
    check_output(out, (path, spool), force=force)
    done = finalize(spool, out, {"complete": False, "recovered_from": str(spool)})
    with contextlib.suppress(OSError):  # its rows are in the trace now
        tail_path(spool).unlink(missing_ok=True)
    return done
