"""Ground truth for the ``torch`` model: every committed PyTorch trace through the real allocator.

Each ``traces/torch-*.parquet`` is replayed on the GPU through PyTorch's own
caching allocator under its recorded settings and limit
(``replay_torch_on_device``), and reserved bytes after every request are
compared three ways: device against the model with the recorded addresses
(``--sim torch``), device against the model fed this device's addresses, and
device against the recording itself. Prints a table; ``--json`` writes the
figures, ``--out DIR`` also writes each replay as a trace.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def _recorded(trace) -> np.ndarray:
    from tracekit.device.compare import reserved_by_request
    from tracekit.trace import Op

    ev = trace.events
    seg = np.flatnonzero((ev.op == Op.SEGMENT_ALLOC) | (ev.op == Op.SEGMENT_FREE))
    return reserved_by_request(len(ev), seg, ev.op[seg], ev.size[seg])


def one(path: Path, out_dir: Path | None, device: int) -> dict:
    from tracekit.device.command import write_output
    from tracekit.device.result import summary
    from tracekit.device.torch_compare import compare_with_model, device_reserved, replayed_requests
    from tracekit.device.torch_replay import replay_torch_on_device
    from tracekit.trace import read_trace

    trace = read_trace(path)
    run = replay_torch_on_device(trace, None, trace.meta.pool_limit_bytes, device, continue_on_oom=True)
    out = write_output(trace, run, (out_dir or Path("/tmp")) / f"{path.stem}.device.parquet")
    comps = compare_with_model(trace, run, read_trace(out))
    req = replayed_requests(trace, run)
    dev, rec = device_reserved(trace, run), _recorded(trace)
    miss = req[dev[req] != rec[req]]
    s = summary(trace, run).to_dict()
    return {
        "trace": path.name, "requests": len(req), "capacity": run.plan.capacity,
        "conf": run.torch.conf, "released": s["device"]["released"],
        "first_oom_seq": (s["oom"] or {}).get("seq"),
        "peak_reserved": run.peak_reserved, "segment_allocs": s["segment_allocs"],
        "segment_frees": s["segment_frees"], "torch": s.get("torch"),
        "model": [c.to_dict() for c in comps],
        "recording": {"same": len(req) - len(miss), "first_index": int(miss[0]) if len(miss) else None,
                      "device": int(dev[miss[0]]) if len(miss) else None,
                      "recorded": int(rec[miss[0]]) if len(miss) else None},
        "malloc_latency_ns": s["device"]["malloc_latency_ns"],
        "free_latency_ns": s["device"]["free_latency_ns"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    out_dir = Path(a.out) if a.out else None
    if out_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
    rows, bad = [], 0
    for p in sorted((ROOT / "traces").glob("torch-*.parquet")):
        try:
            r = one(p, out_dir, a.device)
        except Exception as e:  # report and go on: one trace must not hide the others
            r = {"trace": p.name, "error": f"{type(e).__name__}: {e}"}
        rows.append(r)
        if "error" in r:
            bad += 1
            print(f"{p.name:28} ERROR {r['error']}")
            continue
        m = r["model"]
        ok = all(c["first_index"] is None for c in m) and r["recording"]["first_index"] is None
        bad += not ok
        print(f"{p.name:28} {r['requests']:>7,} requests  model/recorded-addr {m[0]['same']:>7,}  "
              f"model/device-addr {m[1]['same']:>7,}  recording {r['recording']['same']:>7,}  "
              f"released {r['released']}  {'ok' if ok else 'DIFFER'}")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=2, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
