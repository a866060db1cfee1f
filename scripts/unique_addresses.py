"""A copy of a trace in which every malloc has an address of its own (its free the same), the rest
unchanged: the shape of issue 45's reference trace (each block at an address of its own), which
makes the reader's pairing table meet every address once.

    PYTHONPATH=. python3 scripts/unique_addresses.py IN.parquet OUT.parquet
"""

from __future__ import annotations

import sys

import numpy as np

from tracekit.trace import Events, write_trace
from tracekit.trace.reader import read_trace
from tracekit.trace.schema import Op


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    tr = read_trace(src)
    ev, mate = tr.events, tr.mate
    addr = ev.addr.copy()
    mallocs = np.flatnonzero(ev.op == Op.MALLOC)
    addr[mallocs] = (np.arange(len(mallocs), dtype=np.uint64) + 1) << np.uint64(27)  # 128 MiB apart
    frees = np.flatnonzero((ev.op == Op.FREE) & (mate >= 0))
    addr[frees] = addr[mate[frees]]
    write_trace(dst, tr.meta, Events.build(ev.op, ev.size, addr=addr, rounded=ev.rounded, t_ns=ev.t_ns,
                                           seq=ev.seq, stream=ev.stream, device=ev.device))
    print(f"{dst}: {len(np.unique(addr)):,} addresses for {len(ev):,} events")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
