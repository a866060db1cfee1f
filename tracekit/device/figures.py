"""What only a device replay measures: the groups it adds to the one replay summary.

A device replay reports ``tracekit.sim.result.ReplaySummary``, the figures
every replay has, plus these groups (``ReplaySummary.with_figures``):

- ``device`` (``DeviceFigures``): the device and allocator, how many requests
  ran, how ``peak_reserved_bytes`` was measured (``exact`` from the pool's own
  device allocations or PyTorch's segment events, ``driver pool`` from
  ``ReservedMemHigh``, ``sampled`` from ``cudaMemGetInfo``, so a lower bound
  between samples), per-call latency p50/p99 in ns, the CUDA total and the
  free memory at the start, after any ballast and at the end (bytes),
  ``released`` (free memory back to its start, to the byte) and, at the first
  OOM, the device's free memory and the error;
- ``torch`` (``TorchFigures``): the PyTorch version, the settings string
  given, the merged options, whether expandable segments were on, whether
  releases were replayed, and the rebuilt starting state of a wrapped history.

Each group's JSON shape is a ``TypedDict`` (``DeviceFiguresDict``,
``TorchFiguresDict``) made by its ``to_dict`` alone; the keys are the field
names, plus the derived ``released``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np

from tracekit.units import format_size


class LatencyDict(TypedDict):
    p50: float | None
    p99: float | None
    count: int


class DeviceOOMDict(TypedDict):
    device_free: int
    error: str | None


class DeviceFiguresDict(TypedDict):
    """The ``device`` group of a device replay's summary."""

    index: int
    allocator: str
    replayed: int
    peak_reserved: str
    malloc_latency_ns: LatencyDict
    free_latency_ns: LatencyDict
    total: int
    free_start: int
    free_replay: int
    free_end: int
    ballast_bytes: int
    released: bool
    oom: DeviceOOMDict | None


class TorchFiguresDict(TypedDict):
    """The ``torch`` group of a device replay through PyTorch's allocator."""

    version: str
    conf: str
    options: dict[str, str]
    expandable_segments: bool
    release_points: bool
    initial_segments: int
    initial_blocks: int
    initial_misplaced: int


@dataclass(frozen=True)
class Latency:
    """p50 / p99 of one call in ns (None when no call was made), over ``count`` calls."""

    p50: float | None
    p99: float | None
    count: int

    @classmethod
    def of(cls, lat: np.ndarray) -> Latency:
        if len(lat) == 0:
            return cls(None, None, 0)
        p50, p99 = np.percentile(lat, [50, 99])
        return cls(float(p50), float(p99), len(lat))

    def to_dict(self) -> LatencyDict:
        return LatencyDict(p50=self.p50, p99=self.p99, count=self.count)


def _us(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1000:.1f} µs"


@dataclass(frozen=True)
class DeviceOOM:
    """The device at the first OOM: its free memory (bytes, cudaMemGetInfo) and the error."""

    device_free: int
    error: str | None

    def to_dict(self) -> DeviceOOMDict:
        return DeviceOOMDict(device_free=self.device_free, error=self.error)


@dataclass(frozen=True)
class DeviceFigures:
    """The ``device`` group (see the module docstring; bytes unless noted)."""

    index: int
    allocator: str
    replayed: int
    peak_reserved: str
    malloc_latency_ns: Latency
    free_latency_ns: Latency
    total: int
    free_start: int
    free_replay: int
    free_end: int
    ballast_bytes: int
    oom: DeviceOOM | None = None  # None: no OOM, or the device's free memory was not measured
    key: str = "device"

    @property
    def released(self) -> bool:
        return self.free_end == self.free_start

    def to_dict(self) -> DeviceFiguresDict:
        return DeviceFiguresDict(
            index=self.index, allocator=self.allocator, replayed=self.replayed,
            peak_reserved=self.peak_reserved, malloc_latency_ns=self.malloc_latency_ns.to_dict(),
            free_latency_ns=self.free_latency_ns.to_dict(), total=self.total, free_start=self.free_start,
            free_replay=self.free_replay, free_end=self.free_end, ballast_bytes=self.ballast_bytes,
            released=self.released, oom=self.oom.to_dict() if self.oom is not None else None,
        )

    def to_lines(self) -> list[str]:
        m, f = self.malloc_latency_ns, self.free_latency_ns
        lines = [
            f"device         {self.index}, allocator {self.allocator}: {self.replayed:,} requests replayed"
            f" (peak reserved: {self.peak_reserved})",
            f"latency        malloc p50 {_us(m.p50)}, p99 {_us(m.p99)}; "
            f"free p50 {_us(f.p50)}, p99 {_us(f.p99)}",
        ]
        if self.oom is not None:
            lines.append(f"device at OOM  {format_size(self.oom.device_free)} free on the device")
        lines.append("released       " + ("yes" if self.released else
                     f"NO ({self.free_start - self.free_end:,} bytes still taken)"))
        return lines


@dataclass(frozen=True)
class TorchFigures:
    """The ``torch`` group: settings given and reported, the rebuilt starting state."""

    version: str
    conf: str
    options: tuple[tuple[str, str], ...]
    expandable_segments: bool
    release_points: bool
    initial_segments: int = 0
    initial_blocks: int = 0
    initial_misplaced: int = 0
    key: str = "torch"

    def to_dict(self) -> TorchFiguresDict:
        return TorchFiguresDict(
            version=self.version, conf=self.conf, options=dict(self.options),
            expandable_segments=self.expandable_segments, release_points=self.release_points,
            initial_segments=self.initial_segments, initial_blocks=self.initial_blocks,
            initial_misplaced=self.initial_misplaced,
        )

    def to_lines(self) -> list[str]:
        lines = [f"torch          {self.version}, settings {self.conf}"]
        if self.initial_segments:
            lines.append(f"  starting state rebuilt: {self.initial_segments} segments, {self.initial_blocks} "
                         f"blocks, {self.initial_misplaced} not at their recorded offset")
        return lines
