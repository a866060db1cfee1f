"""The ``--gpu-memory`` table: the tests with the highest peaks, one row per test and device."""

from __future__ import annotations

from typing import Any

from tracekit.pytest.measure import Measurement
from tracekit.units import format_size as fs


def table(results: list[tuple[str, dict[str, Any]]], top: int) -> list[str]:
    rows: list[tuple[int, int, str, str, int, str]] = []
    for nodeid, got in results:
        for m in (Measurement.from_json(x) for x in got.get("measurements", [])):
            for d, p in m.devices.items():
                rows.append((p.reserved, p.allocated, nodeid, m.backend, d,
                             fs(p.device_used) if p.device_used is not None else "n/a"))
    if not rows:
        return ["no GPU memory was measured (no test allocated through CuPy or PyTorch)"]
    rows.sort(key=lambda r: (-r[0], -r[1], r[2]))
    head = ("peak reserved", "peak allocated", "device used", "library", "device", "test")
    body = [(fs(r[0]), fs(r[1]), r[5], r[3], str(r[4]), r[2]) for r in rows[:max(1, top)]]
    widths = [max(len(x[i]) for x in (head, *body)) for i in range(len(head) - 1)]
    out = []
    for r in (head, *body):
        cells = [r[i].rjust(widths[i]) if i < 3 else r[i].ljust(widths[i]) for i in range(len(widths))]
        out.append("  ".join([*cells, r[-1]]))
    n_tests = len({r[2] for r in rows})
    out.append(f"{n_tests} test(s) measured; {min(len(rows), max(1, top))} of {len(rows)} row(s) shown")
    return out
