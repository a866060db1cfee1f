"""The moments an export shows: which blocks were live when, weighted by bytes, grouped by stack.

Every moment is a set of ``malloc`` rows, each weighing its ``rounded`` bytes (what the allocator
handed out, as every live-bytes figure of tracekit counts it), summed per stack:

- ``PEAK``: the blocks live just after the event at which the device's live bytes are highest
  (the first such event), one moment per device. live(k) = Σ rounded of mallocs i ≤ k whose paired
  free comes after k (``tracekit.trace.live.live_bytes``), so the moment's total equals the
  analyzer's peak live bytes.
- ``FATAL_OOM`` / ``HANDLED_OOM``: the blocks live on the OOM's device just before its ``oom`` row
  (the moment the request failed: ``tracekit.analysis.pool_state_at``). The fatal OOM is always
  kept; handled ones in seq order up to ``max_ooms`` in all, the rest counted (``omitted_ooms``).
- ``NEVER_FREED``: every malloc without a paired free, all devices.
- ``ALLOCATED``: every malloc of the trace, all devices (freed or not): where the bytes were asked for.

Per stack: ``bytes`` = Σ rounded (uint64, exact), ``blocks`` = how many. Sums over NumPy columns, one
Python step per distinct stack (a few thousand), none per event.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from tracekit.analysis.leaks import pool_state_at
from tracekit.trace.events import Events
from tracekit.trace.live import live_bytes, paired_frees
from tracekit.trace.outcome import fatal_seq
from tracekit.trace.reader import Trace
from tracekit.trace.recorded import RecordedMeta
from tracekit.trace.schema import Op
from tracekit.trace.stacks import StackTable

MAX_OOMS = 16  # OOM moments exported per trace (the fatal one first); the rest are counted


def event_stacks(ev: Events) -> tuple[np.ndarray, StackTable]:
    """Each event's stack id (-1: none) and the stack table they index (trace format v3; a v1/v2
    trace's call-sites are one-frame stacks whose ids are the site ids)."""
    return ev.stack, ev.stacks


class MomentKind(StrEnum):
    PEAK = "peak"
    FATAL_OOM = "fatal_oom"
    HANDLED_OOM = "handled_oom"
    NEVER_FREED = "never_freed"
    ALLOCATED = "allocated"


@dataclass(frozen=True, eq=False)
class Moment:
    """One weighted set of blocks: distinct ``stack`` ids with their ``bytes`` and ``blocks``."""

    kind: MomentKind
    title: str
    seq: int | None  # the event the moment is read at (None: the whole trace)
    device: int | None  # None: every device
    stack: np.ndarray  # int32, distinct, ascending; -1 = no stack recorded
    bytes: np.ndarray  # uint64, Σ rounded per stack
    blocks: np.ndarray  # int64, mallocs per stack

    @property
    def total(self) -> int:
        """Σ bytes over the moment (exact)."""
        return int(self.bytes.sum(dtype=np.uint64)) if len(self.bytes) else 0


@dataclass(frozen=True, eq=False)
class Selection:
    """What an export shows of one trace."""

    moments: tuple[Moment, ...]
    stacks: StackTable
    omitted_ooms: int  # handled OOMs beyond MAX_OOMS, not exported


def by_stack(stack: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct stacks ascending, Σ bytes per stack as uint64, count per stack)."""
    if not len(stack):
        return np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(0, np.int64)
    order = np.argsort(stack, kind="stable")
    s = stack[order]
    starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    total = np.add.reduceat(nbytes[order].astype(np.uint64), starts)
    count = np.diff(np.r_[starts, len(s)]).astype(np.int64)
    return s[starts].astype(np.int32), total, count


def select(trace: Trace, *, max_ooms: int = MAX_OOMS) -> Selection:
    """The moments of ``trace`` (see the module docstring), in the order an export lists them:
    peaks, the fatal OOM, handled OOMs, never freed, all allocated."""
    ev, mate = trace.events, trace.mate
    stack, table = event_stacks(ev)
    devices = [int(d) for d in np.unique(ev.device)]
    many = len(devices) > 1
    weigh = _Weigher(stack, ev.rounded)
    out = []
    for d, k, rows in _peaks(ev, mate):
        seq = int(ev.seq[k])
        out.append(weigh(MomentKind.PEAK, f"live at the peak, seq {seq}{_on(d, many)}", rows, seq, d))
    ooms, omitted = _ooms(ev, trace.meta.recorded, max_ooms)
    for k, fatal in ooms:
        d = int(ev.device[k])
        state = pool_state_at(ev, mate, k)
        rows = state.block_index[ev.device[state.block_index] == ev.device[k]]
        seq = int(ev.seq[k])
        what, kind = ("fatal OOM", MomentKind.FATAL_OOM) if fatal else ("handled OOM", MomentKind.HANDLED_OOM)
        out.append(weigh(kind, f"live at the {what}, seq {seq}{_on(d, many)}", rows, seq, d))
    malloc = ev.op == Op.MALLOC
    out.append(weigh(MomentKind.NEVER_FREED, "never freed", np.flatnonzero(malloc & (mate < 0)), None, None))
    out.append(weigh(MomentKind.ALLOCATED, "all bytes allocated", np.flatnonzero(malloc), None, None))
    return Selection(tuple(out), table, omitted)


@dataclass(frozen=True, eq=False)
class _Weigher:
    """Makes a Moment of malloc rows: their stacks and rounded bytes, summed per stack."""

    stack: np.ndarray
    rounded: np.ndarray

    def __call__(self, kind: MomentKind, title: str, rows: np.ndarray, seq: int | None,
                 device: int | None) -> Moment:
        s, b, c = by_stack(self.stack[rows], self.rounded[rows])
        return Moment(kind, title, seq, device, s, b, c)


def _on(device: int, many: bool) -> str:
    return f", device {device}" if many else ""


def _peaks(ev: Events, mate: np.ndarray) -> list[tuple[int, int, np.ndarray]]:
    """(device, k, malloc rows live just after k) for each device that ever holds a byte, k the first
    event of its highest live bytes. All devices in one pass: the rows sorted by device (stable),
    live = the running sum of each device's deltas (``tracekit.trace.live``), its first maximum per
    device, and a malloc i of device d is live at d's peak k iff i ≤ k and its free comes after k."""
    n = len(ev)
    if not n:
        return []
    malloc = ev.op == Op.MALLOC
    delta = live_bytes(ev.rounded, malloc, paired_frees(ev.op, mate), mate)
    delta = np.diff(delta, prepend=0)  # the per-row change, across devices
    order = np.argsort(ev.device, kind="stable")
    dev = ev.device[order]
    starts = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1]])
    lengths = np.diff(np.r_[starts, n])
    running = np.cumsum(delta[order])
    before = np.r_[0, running[starts[1:] - 1]]  # the sum of the devices sorted ahead of each
    live = running - np.repeat(before, lengths)
    top = np.maximum.reduceat(live, starts)
    first = np.minimum.reduceat(np.where(live == np.repeat(top, lengths), np.arange(n), n), starts)
    peak = np.full(int(dev.max()) - int(dev.min()) + 1, -1, np.int64)
    lo = int(dev.min())
    peak[dev[starts].astype(np.int64) - lo] = np.where(top > 0, order[first], -1)
    k = peak[ev.device.astype(np.int64) - lo]  # each row's device's peak event
    live_rows = np.flatnonzero(malloc & (k >= 0) & (np.arange(n) <= k) & ((mate < 0) | (mate > k)))
    by_dev = live_rows[np.argsort(ev.device[live_rows], kind="stable")]
    cuts = np.searchsorted(ev.device[by_dev], dev[starts])
    ends = np.r_[cuts[1:], len(by_dev)]
    return [(int(d), int(peak[int(d) - lo]), by_dev[a:b])
            for d, a, b in zip(dev[starts].tolist(), cuts.tolist(), ends.tolist(), strict=True)
            if peak[int(d) - lo] >= 0]


def _ooms(ev: Events, recorded: RecordedMeta, max_ooms: int) -> tuple[list[tuple[int, bool]], int]:
    """(row, is fatal) of the OOMs to export, the fatal one first, then handled ones in seq order;
    and how many handled OOMs were left out."""
    rows = np.flatnonzero(ev.op == Op.OOM)
    if not len(rows):
        return [], 0
    fatal = fatal_seq(ev, recorded)
    is_fatal = ev.seq[rows] == np.uint64(fatal) if fatal is not None else np.zeros(len(rows), bool)
    chosen = [(int(k), True) for k in rows[is_fatal]]
    handled = rows[~is_fatal]
    room = max(max_ooms - len(chosen), 0)
    chosen += [(int(k), False) for k in handled[:room]]
    return chosen, max(len(handled) - room, 0)
