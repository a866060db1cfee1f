"""Where PyTorch's allocator departs from the recording of traces/torch-handled-oom.parquet (diagnostic).

Run on a GPU machine from the repository root (``PYTHONPATH=. python scripts/gpu_torch_departure.py``):
replays the trace through PyTorch's caching allocator, then prints the first request where the
device's reserved bytes differ from the recording's, the events just before it, and the segment
rows of the device and of the recording around it (size, address), so the extra segment can be
matched to the request that made it.
"""

from __future__ import annotations

import numpy as np

from tracekit.device.compare import reserved_by_request
from tracekit.device.torch_compare import device_reserved, replayed_requests
from tracekit.device.torch_replay import replay_torch_on_device
from tracekit.trace import Op, read_trace


def main() -> None:
    trace = read_trace("traces/torch-handled-oom.parquet")
    ev = trace.events
    run = replay_torch_on_device(trace, None, trace.meta.pool_limit_bytes, 0, continue_on_oom=True)
    req = replayed_requests(trace, run)
    dev = device_reserved(trace, run)
    seg = np.flatnonzero((ev.op == Op.SEGMENT_ALLOC) | (ev.op == Op.SEGMENT_FREE))
    rec = reserved_by_request(len(ev), seg, ev.op[seg], ev.size[seg])
    bad = req[dev[req] != rec[req]]
    print("settings", run.torch.settings)
    if not len(bad):
        print("no departure")
        return
    i = int(bad[0])
    print(f"first departure at event {i} (request {int(np.searchsorted(req, i))}): "
          f"device {dev[i]} recorded {rec[i]}")
    for k in range(max(0, i - 12), min(len(ev), i + 3)):
        print(f"  ev {k} {Op(ev.op[k]).name:<13} size {int(ev.size[k]):>10} rounded {int(ev.rounded[k]):>10} "
              f"addr {int(ev.addr[k]):#x} stream {int(ev.stream[k])} status {int(run.status[k])} dev-addr "
              f"{int(run.addr[k]):#x}")
    before = np.asarray(run.rows.before)
    ops, sizes = np.asarray(run.rows.op), np.asarray(run.rows.size)
    addrs = np.asarray(run.rows.addr, dtype=np.uint64)
    print("device segment rows up to the departure:")
    for r in np.flatnonzero(before <= i + 1)[-12:]:
        print(f"  before ev {int(before[r])} {Op(ops[r]).name:<13} size {int(sizes[r]):>10} "
              f"addr {int(addrs[r]):#x}")
    print("recorded segment rows up to the departure:")
    for k in seg[seg <= i][-12:]:
        print(f"  ev {k} {Op(ev.op[k]).name:<13} size {int(ev.size[k]):>10} addr {int(ev.addr[k]):#x}")



def compare() -> None:
    """Both comparisons with the model: on the input trace and on the replay's own output."""
    import tempfile
    from pathlib import Path

    from tracekit.device.command import write_output
    from tracekit.device.torch_compare import compare_with_model

    trace = read_trace("traces/torch-handled-oom.parquet")
    run = replay_torch_on_device(trace, None, trace.meta.pool_limit_bytes, 0, continue_on_oom=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = read_trace(write_output(trace, run, Path(tmp) / "out.parquet"))
        for c in compare_with_model(trace, run, out):
            print(c.to_dict())


if __name__ == "__main__":
    import sys

    compare() if sys.argv[1:] == ["compare"] else main()
