"""The failing request as the program's own error names it, beside the size the trace recorded.

PyTorch's ``OutOfMemoryError`` says "Tried to allocate 122.00 MiB": the bytes its caching allocator
asked the device for (``cudaMalloc``), which is the segment it needed, not the block: the request
rounded to a block (``rounded``), then up to a segment size (2 MiB for blocks of at most 1 MiB,
20 MiB below 10 MiB, else the next multiple of 2 MiB; ``tracekit.sim.torch_rules.segment_sizes``).
The trace records the block, so the two figures differ; the page shows both and says why. The
message is the recorder's ``exit.message`` (``TraceMeta.recorded.exit``, ``tracekit.trace.recorded``):
only the OOM the program died of has one.
"""

from __future__ import annotations

import re

import numpy as np

from tracekit.analysis.summary import OOMReport
from tracekit.sim.torch_rules import segment_sizes
from tracekit.trace.recorded import ExitInfo
from tracekit.units import format_size

_TRIED = re.compile(r"Tried to allocate (\d+(?:\.\d+)?) ?([KMGTP]i?B|B|bytes)")
_UNITS = {"B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50,
          "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "PB": 1 << 50}


def tried_bytes(message: str) -> tuple[str, int] | None:
    """("Tried to allocate 122.00 MiB", its bytes, to the message's precision) from an OOM message."""
    m = _TRIED.search(message)
    if m is None:
        return None
    return m.group(0), int(float(m.group(1)) * _UNITS[m.group(2)])


def reported_request(ex: ExitInfo | None, o: OOMReport,
                     expandable: bool = False) -> tuple[str | None, str | None]:
    """(what the program's error says it tried to allocate, why that differs from the recorded request),
    for the OOM ``o`` the program died of; (None, None) where the trace holds no such message. ``ex``:
    the trace's ``exit`` (``TraceMeta.recorded.exit``)."""
    if ex is None or ex.message is None or o.handled or (ex.oom_seq is not None and ex.oom_seq != o.seq):
        return None, None
    found = tried_bytes(ex.message)
    if found is None:
        return None, None
    said, n = found
    if format_size(n) == format_size(o.rounded):
        return said, None
    seg = int(segment_sizes(np.array([o.rounded], np.int64))[0])
    if not expandable and format_size(n) == format_size(seg):
        rule = ("2 MiB for a block of at most 1 MiB" if o.rounded <= 1 << 20 else
                "20 MiB for a block below 10 MiB" if o.rounded < 10 << 20 else "the next multiple of 2 MiB")
        return said, (f"PyTorch names the segment it asked the device for: the block of "
                      f"{format_size(o.rounded)} rounded up to a segment ({rule}); the trace records "
                      f"the block")
    return said, (f"the program's error names {format_size(n)}, the trace records the block of "
                  f"{format_size(o.rounded)}: the allocator asked the device for a different amount than the "
                  f"block it needed")
