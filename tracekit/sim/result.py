"""The one result type of a replay, simulated or on a device: ``ReplaySummary``.

Every replay, through a simulated policy (``tracekit.sim.engine``) or on a GPU
(``tracekit.device``), reports the same figures in the same vocabulary, so
printers, the report and CI gates read one shape (bytes unless noted):

- ``policy``: the simulated policy, or the real allocator of a device replay;
- ``capacity`` (heap size or pool limit; None = unbounded), ``device_total``;
- ``events``: input events;
- ``peak_live_bytes``: max over time of the allocated (rounded) sizes of live blocks;
- ``peak_reserved_bytes``: device memory the allocator held at most (for a heap
  policy its high-water mark, ``peak_extent``, None for pools and devices);
- ``segment_allocs`` / ``segment_frees``: device allocations made and released;
- ``oom`` (``OOMInfo``, the first failed request and the allocator's state then),
  ``oom_count``, ``stopped`` (the replay ended at the first OOM).

A replay that measures more adds its own groups of figures with
``with_figures``: each ``Figures`` object has a JSON key, a ``to_dict`` and
``to_lines`` for the text summary. The JSON shapes are ``OOMInfoDict`` and
``ReplaySummaryDict`` (a group adds its own key, typed where the group is
defined), each produced by its dataclass's ``to_dict`` alone; keys are the
field names, except ``handled_oom_count`` (the field ``handled_ooms``). A device replay, for one, adds a group
``device`` (call latencies, sampled ``device_free``, the comparison with a
simulated policy) to the common figures above, rather than a summary of its
own. ``ReplayResult`` is a simulated replay's summary with its raw
``PolicyRun`` and settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol, TypedDict, cast

from tracekit.sim.base import PolicyRun, SimConfig
from tracekit.units import format_size


class Figures(Protocol):
    """A group of figures a replay adds to the common summary."""

    @property
    def key(self) -> str: ...  # the group's key in ``to_dict``, e.g. "device"

    def to_dict(self) -> Mapping[str, object]: ...

    def to_lines(self) -> list[str]: ...


class OOMInfoDict(TypedDict):
    """``OOMInfo`` in JSON: its fields and the derived ``cause``."""

    seq: int
    size: int
    rounded: int
    free_bytes: int
    largest_free_block: int | None
    live_bytes: int
    reserved_bytes: int
    cause: str


class ReplaySummaryDict(TypedDict):
    """``ReplaySummary`` in JSON (``replay --json``); each group of figures adds its own key."""

    policy: str
    capacity: int | None
    device_total: int | None
    events: int
    peak_live_bytes: int
    peak_reserved_bytes: int
    peak_extent: int | None
    segment_allocs: int
    segment_frees: int
    oom: OOMInfoDict | None
    oom_count: int
    handled_oom_count: int


@dataclass(frozen=True)
class OOMInfo:
    """The first failed request: its input ``seq``, requested and rounded bytes,
    and the allocator's state then (bytes). ``cause`` is ``fragmentation`` when
    free_bytes >= rounded (enough memory, no block big enough); ``limit`` when a pool's free
    blocks and the bytes its limit left unreserved (``room_bytes``) together held it, but neither
    in one piece (analyze's word for the same request: the pool's limit stopped it); else
    ``exhausted``. ``room_bytes``: the capacity less the reserved bytes (None: no capacity; 0
    for a heap, which reserves its whole capacity); not in the JSON, which has the capacity."""

    seq: int
    size: int
    rounded: int
    free_bytes: int
    largest_free_block: int | None  # None where nothing reports it (a device replay)
    live_bytes: int
    reserved_bytes: int
    room_bytes: int | None = field(default=None, compare=False)  # the capacity's, not the replay's steps

    @property
    def cause(self) -> str:
        if self.free_bytes >= self.rounded:
            return "fragmentation"
        room = self.room_bytes or 0
        if room > 0 and self.free_bytes + room >= self.rounded:
            return "limit"
        return "exhausted"

    def to_dict(self) -> OOMInfoDict:
        return OOMInfoDict(
            seq=self.seq, size=self.size, rounded=self.rounded, free_bytes=self.free_bytes,
            largest_free_block=self.largest_free_block, live_bytes=self.live_bytes,
            reserved_bytes=self.reserved_bytes, cause=self.cause,
        )


@dataclass(frozen=True)
class ReplaySummary:
    """The numbers of one replay (bytes unless noted; ``peak_extent`` None for pools)."""

    policy: str
    capacity: int | None
    device_total: int | None
    events: int  # input events
    peak_live_bytes: int
    peak_reserved_bytes: int
    peak_extent: int | None
    segment_allocs: int
    segment_frees: int
    oom: OOMInfo | None
    oom_count: int
    stopped: bool  # the replay ended at the first OOM (no --continue-on-oom)
    figures: tuple[Figures, ...] = ()  # more groups a replay measured (see the module docstring)
    handled_ooms: int = 0  # requests the program survived that failed in the replay too (it went on)

    def with_figures(self, *groups: Figures) -> ReplaySummary:
        """This summary with more groups of figures."""
        return replace(self, figures=self.figures + groups)

    def to_dict(self) -> ReplaySummaryDict:
        d = ReplaySummaryDict(
            policy=self.policy, capacity=self.capacity, device_total=self.device_total, events=self.events,
            peak_live_bytes=self.peak_live_bytes, peak_reserved_bytes=self.peak_reserved_bytes,
            peak_extent=self.peak_extent, segment_allocs=self.segment_allocs,
            segment_frees=self.segment_frees, oom=self.oom.to_dict() if self.oom else None,
            oom_count=self.oom_count, handled_oom_count=self.handled_ooms,
        )
        groups = cast(dict[str, object], d)  # each group's key and shape are the group's own
        for group in self.figures:
            groups[group.key] = group.to_dict()
        return d

    def group(self, key: str) -> Figures | None:
        """The group of figures under ``key`` (e.g. ``device``), None when this replay has none."""
        return next((g for g in self.figures if g.key == key), None)

    def to_text(self) -> str:
        cap = "unbounded"
        if self.capacity is not None:
            cap = f"{format_size(self.capacity)} ({self.capacity} bytes)"
        reserved = format_size(self.peak_reserved_bytes)
        if self.peak_extent is not None:  # a single heap: what it held is how far it reached
            reserved += " (heap high-water mark)"
        lines = [
            f"policy         {self.policy}",
            f"capacity       {cap}",
            f"events         {self.events:,}",
            f"peak live      {format_size(self.peak_live_bytes)}",
            f"peak reserved  {reserved}",
        ]
        lines.append(f"segments       {self.segment_allocs} allocated, {self.segment_frees} freed")
        lines += self._oom_lines()
        for group in self.figures:
            lines += group.to_lines()
        return "\n".join(lines)

    def _oom_lines(self) -> list[str]:
        o = self.oom
        handled = ([f"handled OOMs   {self.handled_ooms:,} request(s) the program survived failed here too; "
                    "the replay went on, as the program did"] if self.handled_ooms else [])
        if o is None:
            return ["out of memory  no", *handled]
        lines = [*handled,
            f"out of memory  at seq {o.seq}: request {format_size(o.size)} "
            f"(rounded {format_size(o.rounded)})",
            f"  free {format_size(o.free_bytes)}, largest free block {format_size(o.largest_free_block)}, "
            f"live {format_size(o.live_bytes)}, reserved {format_size(o.reserved_bytes)}",
        ]
        if o.cause == "fragmentation":
            lines.append("  cause: fragmentation (enough bytes free, but no free block is large enough)")
        elif o.cause == "limit":
            lines.append(f"  cause: limit (the pool's free blocks and the {format_size(o.room_bytes)} its "
                         "limit left unreserved held the request together, but not in one piece: a new "
                         "segment would pass the limit)")
        else:
            lines.append("  cause: exhausted (fewer bytes free than requested)")
        if self.stopped:
            lines.append("  the replay stopped here (--continue-on-oom goes on past failed requests)")
        elif self.oom_count > 1:
            lines.append(f"  {self.oom_count:,} requests failed in all")
        return lines


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """A policy's raw run plus its summary."""

    policy: str
    config: SimConfig
    run: PolicyRun
    summary: ReplaySummary
    warnings: tuple[str, ...] = ()  # for the user: skipped input events, several devices

    @property
    def ran_out(self) -> bool:
        return self.summary.oom is not None

    def to_dict(self) -> ReplaySummaryDict:
        return self.summary.to_dict()

    def to_text(self) -> str:
        return self.summary.to_text()
